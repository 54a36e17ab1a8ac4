"""``modkit plan``'s parameter, gradient and AdamW bytes per rank equal what real runs allocate, to the byte: every
layout that trains today (FSDP2, TP, TP x FSDP2, CP x FSDP2, CP x TP, PP x FSDP2, PP x TP, uneven PP, EP, EP x
FSDP2, EP x PP) on a dense llama, a mixture of experts and multi-head latent attention, on 4 gloo CPU processes
(``tests/dist_scripts/plan_bytes.py``). The planner reports the largest rank of the worst stage; here every
stage is checked against the largest of its ranks."""

from __future__ import annotations

import sys

import pytest

from modkit.parallel.planner import Layout, Planner

from tests.parallel.test_pipeline_context import SCRIPTS, _torchrun, needs_gloo

WORLD = 4


def _script():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import plan_bytes
    finally:
        sys.path.remove(str(SCRIPTS))
    return plan_bytes


def layout_of(degrees: dict, micro: int) -> Layout:
    """The planner's layout of ``make_mesh(**degrees)`` on ``WORLD`` ranks (``ep`` borrows from ``dp``)."""
    tp, cp, pp = (degrees.get(k, 1) for k in ("tp", "cp", "pp"))
    dp = WORLD // (tp * cp * pp)
    return Layout(dp=dp, tp=tp, cp=cp, pp=pp, ep=degrees.get("ep", 1), microbatches=max(1, micro))


@pytest.mark.slow
@needs_gloo
def test_planner_bytes_equal_what_every_layout_allocates(tmp_path):
    script = _script()
    ranks = _torchrun("plan_bytes.py", WORLD, tmp_path)
    specs = script.specs()
    planners = {name: Planner(spec, batch=script.BATCH, seq_len=script.SEQ) for name, spec in specs.items()}
    checked = 0
    for case, (spec_name, degrees, micro) in script.CASES.items():
        layout = layout_of(degrees, micro)
        for stage in range(layout.pp):
            held = [r[case] for r in ranks.values() if r[case]["stage"] == stage]
            assert len(held) == WORLD // layout.pp
            got = {k: 4 * max(h[k] for h in held) for k in ("params", "grads", "optimizer")}
            plan = {k: 4 * v for k, v in planners[spec_name].rank_elements(layout, stage).items()}
            assert plan == got, (case, stage, plan, got)
            checked += 1
    assert checked == len(script.CASES) + 3 + 3  # the pp 2 cases' second stages and pp 4's three more
