"""One version source: the package metadata and the API's OpenAPI document read
``dprc_core.__version__``."""

from __future__ import annotations

from importlib.metadata import version

import dprc_core
from api.app import create_app


def test_one_version_everywhere(tmp_path):
    from service.base.settings import Settings

    app = create_app(Settings(data_dir=tmp_path))
    assert app.version == dprc_core.__version__ == version("dprc")
