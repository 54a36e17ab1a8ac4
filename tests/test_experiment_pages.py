"""The experiment pages under ``docs/experiments/`` quote only what their runs produced.

A page that shows a ``modkit compare`` command and links a results folder ``docs/experiments/results/<stem>/`` (the
command's report folder, less ``runs/``; a page of several commands has one subfolder per report folder) must have
its ``report.md`` and ``results.json`` files; every ``mean ± std`` figure in the page's tables must appear verbatim in
one of those ``report.md``. Every file a page links in
its results folder (the raw outputs of ``modkit cost``, ``modkit trace`` or a benchmark), every image it shows and
every spec or training config under ``docs/experiments/specs/`` it names must exist. A page without a results
folder (one written before the convention) is held to the image and file checks only. No training runs here: the
checks read the committed files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "docs" / "experiments"
PAGES = sorted(EXPERIMENTS.glob("*.md"))

#: a results folder linked from a page: ``results/<stem>/...``
RESULTS_LINK = re.compile(r"\]\((?:\./)?results/([^/)\s]+)/")
#: an image: ``![alt](path)`` (an optional title after the path is ignored)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")
#: a mean ± sample std figure as :func:`modkit.compare.fmt_pm` writes it
MEAN_STD = re.compile(r"-?\d[\d,]*(?:\.\d+)? ± \d[\d,]*(?:\.\d+)?")
#: a link into the results folders: ``](results/<stem>/<file>)``
RESULT_FILE = re.compile(r"\]\(((?:\./)?results/[^)\s#]+)")
#: a file of the experiments' specs folder named anywhere in the page (commands, prose)
SPEC_FILE = re.compile(r"docs/experiments/specs/[\w.\-]+\.json")


def page_problems(page: Path, repo: Path = REPO) -> list[str]:
    """Everything wrong with one experiment page (empty when it is consistent with its results folder).

    Args:
        page: a Markdown file in the experiments folder.
        repo: the repository root that ``docs/experiments/specs/...`` paths in the page are relative to.

    Returns:
        One line per problem: a missing results folder or file, a missing image or spec file, a table figure
        ``mean ± std`` that the results folder's ``report.md`` does not contain.
    """
    text = page.read_text(encoding="utf-8")
    problems = []
    for link in IMAGE.findall(text):
        if "://" not in link and not (page.parent / link).is_file():
            problems.append(f"{page.name}: image {link} does not exist")
    images = set(IMAGE.findall(text))
    for link in RESULT_FILE.findall(text):
        if link not in images and not (page.parent / link).exists():
            problems.append(f"{page.name}: {link} does not exist")
    for name in sorted(set(SPEC_FILE.findall(text))):
        if not (repo / name).is_file():
            problems.append(f"{page.name}: {name} does not exist")
    folders = sorted(set(RESULTS_LINK.findall(text)))
    if not folders:
        return problems
    if folders != [page.stem]:
        problems.append(f"{page.name}: links results folders {folders}; a page links only results/{page.stem}/")
    if "modkit compare" not in text:
        return problems
    results = page.parent / "results" / page.stem
    reports = sorted(results.rglob("report.md"))  # one per command: the folder itself, or one subfolder each
    if not reports:
        reports = [results / "report.md"]
    for report in reports:
        for required in ("report.md", "results.json"):
            if not (report.parent / required).is_file():
                problems.append(f"{page.name}: {(report.parent / required).relative_to(page.parent)} does not exist")
    reports = [r for r in reports if r.is_file()]
    if not reports:
        return problems
    texts = [r.read_text(encoding="utf-8") for r in reports]
    table_lines = [line for line in text.splitlines() if line.lstrip().startswith("|")]
    figures = [m for line in table_lines for m in MEAN_STD.findall(line)]
    if not figures:
        problems.append(f"{page.name}: links results/{page.stem}/ but its tables quote no mean ± std figure")
    where = " or ".join(str(r.relative_to(page.parent)) for r in reports)
    for figure in figures:
        if not any(figure in t for t in texts):
            problems.append(f"{page.name}: {figure!r} is not in {where}")
    return problems


def test_there_are_experiment_pages():
    assert len(PAGES) >= 1


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_quotes_only_its_run(page):
    assert page_problems(page) == []


def test_every_results_folder_has_a_page():
    folders = sorted(p.name for p in (EXPERIMENTS / "results").iterdir() if p.is_dir()) if (EXPERIMENTS / "results").is_dir() else []
    assert [f for f in folders if not (EXPERIMENTS / f"{f}.md").is_file()] == []


# ------------------------------------------------------------------------------------------------ the checker itself

REPORT = """# Design comparison

| spec | parameters | active parameters | lr | tokens/s | train loss | validation loss | diverged |
|---|---:|---:|---:|---:|---:|---:|---:|
| a | 1,000 | 1,000 | 0.001 | 10,000 | 1.7303 ± 0.0133 | 1.8765 ± 0.0077 | 0/3 |
"""


def _experiment(tmp_path: Path, page: str, *, report: str = REPORT, files=("report.md", "results.json", "curves.png")) -> Path:
    root = tmp_path / "docs" / "experiments"
    (root / "results" / "ab").mkdir(parents=True)
    (root / "specs").mkdir()
    (root / "specs" / "a.json").write_text("{}")
    for name in files:
        (root / "results" / "ab" / name).write_text(report if name == "report.md" else "x")
    (root / "ab.md").write_text(page)
    return root / "ab.md"


GOOD = """# A versus B

```bash
modkit compare docs/experiments/specs/a.json --train docs/experiments/specs/a.json --seeds 3 -o /tmp/ab
```

| spec | validation loss |
|---|---:|
| a | 1.8765 ± 0.0077 |

![curves](results/ab/curves.png)
"""


def test_checker_accepts_a_page_that_quotes_its_report(tmp_path):
    assert page_problems(_experiment(tmp_path, GOOD), repo=tmp_path) == []


def test_checker_rejects_a_figure_the_report_lacks(tmp_path):
    page = _experiment(tmp_path, GOOD.replace("1.8765 ± 0.0077", "1.8700 ± 0.0077"))
    assert page_problems(page, repo=tmp_path) == ["ab.md: '1.8700 ± 0.0077' is not in results/ab/report.md"]


def test_checker_rejects_missing_image_spec_and_results_file(tmp_path):
    page = _experiment(tmp_path, GOOD.replace("a.json --train", "b.json --train"), files=("report.md", "curves.png"))
    (page.parent / "results" / "ab" / "curves.png").unlink()
    assert page_problems(page, repo=tmp_path) == [
        "ab.md: image results/ab/curves.png does not exist",
        "ab.md: docs/experiments/specs/b.json does not exist",
        "ab.md: results/ab/results.json does not exist",
    ]


def test_checker_ignores_figures_outside_tables_and_pages_without_results(tmp_path):
    prose = GOOD.replace("| a | 1.8765 ± 0.0077 |", "| a | 1.8765 ± 0.0077 |\n\nRuns spread 9.9999 ± 9.9999 in prose.")
    assert page_problems(_experiment(tmp_path, prose), repo=tmp_path) == []
    plain = tmp_path / "docs" / "experiments" / "plain.md"
    plain.write_text("| a | 1.0000 ± 0.1000 |\n")
    assert page_problems(plain, repo=tmp_path) == []


def test_checker_holds_pages_without_a_compare_to_the_files_they_link(tmp_path):
    page = _experiment(tmp_path, "# Costs\n\nThe tables: [tables.md](results/ab/tables.md), [raw](results/ab/cost.json).\n",
                       files=("cost.json",))
    assert page_problems(page, repo=tmp_path) == ["ab.md: results/ab/tables.md does not exist"]


def test_checker_reads_one_report_per_command_in_subfolders(tmp_path):
    page = _experiment(tmp_path, GOOD.replace("results/ab/curves.png", "results/ab/one/curves.png"), files=())
    for sub, report in (("one", REPORT), ("two", REPORT.replace("1.8765 ± 0.0077", "1.9000 ± 0.0100"))):
        (page.parent / "results" / "ab" / sub).mkdir()
        for name in ("report.md", "curves.png"):
            (page.parent / "results" / "ab" / sub / name).write_text(report if name == "report.md" else "x")
    (page.parent / "results" / "ab" / "one" / "results.json").write_text("{}")
    both = page.read_text().replace("| a | 1.8765 ± 0.0077 |", "| a | 1.8765 ± 0.0077 |\n| b | 1.9000 ± 0.0100 |\n| c | 2.0000 ± 0.0100 |")
    page.write_text(both)
    assert page_problems(page, repo=tmp_path) == [
        "ab.md: results/ab/two/results.json does not exist",
        "ab.md: '2.0000 ± 0.0100' is not in results/ab/one/report.md or results/ab/two/report.md",
    ]
