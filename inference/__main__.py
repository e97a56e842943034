"""``python -m inference --host H --port P [...]``: run the engine (docs/inference_engine.md)."""

from __future__ import annotations

import logging
import os
import threading
import time

from inference.settings import parse_args

PARENT_ENV = "DPRC_INFERENCE_PARENT_PID"


def _exit_with_parent() -> None:
    """Started by the API (``DPRC_INFERENCE_PARENT_PID``): end when that process is gone, even
    killed with SIGKILL, so no engine outlives its API and keeps its port, memory and models."""
    parent = int(os.environ[PARENT_ENV])

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        logging.getLogger("inference").warning("the API process %d is gone: exiting", parent)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # torch's idle OpenMP workers sleep instead of spinning: they would take the CPU from the
    # event loop's thread between steps (docs/inference_engine.md, "Threads"); the thread count
    # stays torch's default. Set before torch is imported; an explicit setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    settings = parse_args(argv)
    if os.environ.get(PARENT_ENV, "").isdigit():
        _exit_with_parent()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    import uvicorn

    from inference.app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
    )


if __name__ == "__main__":
    main()
