"""A unit (a user, or an example id) is on one rank (issue 40): on 2 gloo ranks (CPU), a user
whose rows two ranks carry is refused at ``step()`` on both ranks — each rank would clip its
rows of the user as one sample, so the user would contribute up to C twice — and so are an
example id on two ranks and ranks disagreeing on the unit; batches whose units are on one rank
each step (``scenario_units`` of tests/dprc_core/distributed/ddp_scenarios.py, and of
fsdp_scenarios.py for an FSDP2-sharded model), in the launches the other tests here share
(tests/dprc_core/distributed/conftest.py)."""

from __future__ import annotations

import json


def test_a_unit_on_two_ranks_is_refused_on_both_and_disjoint_units_step(ddp_out):
    tmp_path = ddp_out("units")
    for rank in (0, 1):
        got = json.loads((tmp_path / f"units-rank{rank}.json").read_text())
        assert got["disjoint"] == got["again"] == 4  # 2 users a rank, 4 in the batch
        assert got["users"].startswith(
            "user(s) 5 (ranks [0, 1]) contributed to this logical batch on two ranks"
        )
        assert got["examples"].startswith(
            "example id(s) 5 (ranks [0, 1]) contributed to this logical batch on two ranks"
        )
        assert got["units"].startswith("the ranks disagree on this logical batch's privacy unit")
        assert got["steps"] == 2  # the refused batches took no step


def test_a_user_on_two_ranks_of_a_sharded_model_is_refused_on_both(fsdp_out):
    tmp_path = fsdp_out(2, "units")
    for rank in (0, 1):
        got = json.loads((tmp_path / f"units-rank{rank}.json").read_text())
        assert got["sizes"] == [4, 4]  # 2 users a rank, 4 in the batch
        assert got["users"].startswith(
            "ValueError: user(s) 5 (ranks [0, 1]) contributed to this logical batch on two ranks"
        )
        assert got["unchanged"] is True and got["steps"] == 2  # the refused batch: no step
