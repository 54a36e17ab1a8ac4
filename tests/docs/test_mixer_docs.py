"""The docs know token mixers: the plugin guide's contract-check table is the one generated from the registered checks
(so it cannot drift), the guide shows the recurrent example as it is in its file, the component pages say which spec
slots a component goes in (every attention and recurrent mixer: ``block.mixer``, ``overrides[].mixer``), and the
gallery calls the token-mixing slot ``mixer``."""

from __future__ import annotations

import re
from pathlib import Path

import modkit
from modkit import docs
from modkit.docs.checks import BEGIN, END, check_rows, check_table, fill_check_table
from modkit.testing.checks import CHECKS
from tests.conftest import REPO, SPECS

GUIDE = REPO / "docs" / "guides" / "writing-a-plugin.md"


def test_the_guide_s_check_table_is_the_generated_one():
    """Every registered check has its row (those the hand-written table lacked included); the checked-in copy is what
    ``python -m modkit.docs.checks`` writes, and the site build fills the same table in."""
    rows = check_rows()
    assert [r[0] for r in rows] == [f"`{c.name}`" for c in CHECKS]
    by_name = {r[0].strip("`"): r for r in rows}
    for name in ("param_roles", "flops", "document_mask", "sampling", "optimizer"):
        assert name in by_name
    assert by_name["spec_roundtrip"][2] == "every component"
    assert by_name["sampling"][2] == "`logits_processor`, `stop_condition`"  # computed: its applies has no docstring
    assert by_name["optimizer"][2] == "`optimizer`"
    assert by_name["kv_cache_decode"][2].startswith("Every component; a token mixer (attention or mixer)")
    assert by_name["masked_row"][3].startswith("a plain softmax with no dead-row guard")  # its Catches: paragraph
    guide = GUIDE.read_text()
    assert guide.count(BEGIN) == 1 and guide.count(END) == 1
    shown = guide[guide.index(BEGIN) : guide.index(END) + len(END)]
    assert shown == check_table(), "stale table: run python -m modkit.docs.checks docs/guides/writing-a-plugin.md"
    page = f"# Guide\n\n{BEGIN}\n| stale |\n{END}\n\nafter\n"
    assert fill_check_table(page) == f"# Guide\n\n{check_table()}\n\nafter\n"
    assert fill_check_table("no table here") == "no table here"


def test_the_checks_command_rewrites_and_checks_a_file(tmp_path, capsys):
    from modkit.docs.checks import main

    page = tmp_path / "guide.md"
    page.write_text(f"intro\n\n{BEGIN}\n| old |\n{END}\n")
    assert main([str(page), "--check"]) == 1 and "stale contract-check table" in capsys.readouterr().err
    assert main([str(page)]) == 0 and main([str(page), "--check"]) == 0
    assert page.read_text() == f"intro\n\n{check_table()}\n"


def test_the_guide_shows_the_recurrent_example_as_it_is_in_its_file():
    guide = GUIDE.read_text()
    section = guide[guide.index("### A recurrent mixer: its state in the cache") : guide.index("### Routers")]
    code = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    example = (REPO / "docs" / "examples" / "retention.py").read_text()
    assert code in example and "def cache_spec(self)" in code and "inputs.cache_for(self)" in code
    contract = guide[guide.index("**`mixer`**") : guide.index("**`position`**")]
    for what in (
        "cache_spec()",
        "inputs.cache_for(self)",
        "kv_cache",
        "causal_safe",
        "document_mask",
        "position_geometry",
        "`flops`",
        "`param_roles`",
    ):
        assert what in contract, what


def test_component_pages_say_which_slots_a_mixer_goes_in():
    """The four attention pages said 'goes in a spec at: (no slot)'."""
    reg = modkit.get_registry()
    places = docs.slot_places(reg)
    for kind in ("attention", "mixer"):
        assert places[kind][:2] == ["`block.mixer`", "`overrides[].mixer`"], places[kind]
    contracts = docs.kind_contracts()
    by_key = {d.entry.key: d for d in docs.component_docs(reg)}
    for key in (("attention", t) for t in reg.types("attention")):
        page = docs.component_page(by_key[key], reg, contracts, places)
        line = next(x for x in page.splitlines() if "goes in a spec at" in x)
        assert "`block.mixer`" in line and "`overrides[].mixer`" in line and "(no slot)" not in line, key
    page = docs.component_page(by_key[("mixer", "mamba2")], reg, contracts, places)
    assert "`block.mixer`" in next(x for x in page.splitlines() if "goes in a spec at" in x)


def test_the_gallery_calls_the_slot_mixer():
    reg = modkit.get_registry()
    card = docs.spec_card(SPECS / "tiny-hybrid.json", reg, REPO)
    page = docs.gallery_page(card, reg)
    assert "| mixer (layer 0) | `gated_deltanet`" in page
    assert "mixer: `gqa`" in page and "attention: `gqa`" not in page  # the per-layer overrides
    index = docs.gallery_index([card], reg)
    assert "| mixer | ffn |" in index and "| attention |" not in index
    assert not Path(SPECS / "tiny-hybrid.json").read_text().count('"attention"')  # the spec writes 'mixer'
