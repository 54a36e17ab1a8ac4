"""One report from several comparison folders (:func:`merge_reports`): their rows in one table, the verdicts
recomputed, the plots redrawn; nothing trains."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence, Union

from .report import _row_from_json, verdicts_of, write_files
from .results import CompareError, Comparison, SpecRow
from .saved import read_results


def merge_reports(
    dirs: Sequence[Union[str, Path]], out_dir: Union[str, Path], *, command: Optional[str] = None
) -> Comparison:
    """One report from several comparison folders: every row of each, the verdicts recomputed, the curves replotted.
    Nothing trains.

    Sources whose labels are all new join one table, and each design in it is compared with the first row of the
    merged table at every size (paired where the seeds match). A source that repeats a label of an earlier source
    (the same designs again, typically at another learning rate or budget) has every label of its rows suffixed
    ``@K`` (``K``: the source's position in ``dirs``, from 1; the earlier source's rows get theirs too) and is
    compared within itself, each design against that source's first row: a verdict never pairs the runs of one
    source with the reference of another when the same label names both.

    Raises:
        CompareError: no folder, a folder without ``results.json``, a ``results.json`` that is not one modkit
            wrote (read strictly and checked by :func:`~modkit.experiments.compare.saved.read_results`: the file,
            row and field named), or ``out_dir`` already holding a comparison.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if not dirs:
        raise CompareError("no comparison folders to merge; give one or more folders written by modkit compare")
    if (out / "results.json").exists():
        raise CompareError(f"{out} already holds a comparison; choose another report folder")
    loaded: list[tuple[list[SpecRow], list[SpecRow]]] = []
    sources, recipes, scopes = [], [], []
    seq_len = eval_len = n_buckets = None
    for d in dirs:
        path = Path(d) / "results.json"
        if not path.is_file():
            raise CompareError(f"{d}: no results.json; give folders written by modkit compare")
        saved = read_results(path)
        sources.append(f"{d}" + (f" (`{saved['command']}`)" if saved.get("command") else ""))
        recipes.append(saved.get("recipe") or "")
        scopes.append(saved.get("scope") or "")
        seq_len = seq_len or saved.get("seq_len", 0)
        eval_len = eval_len or saved.get("eval_len", 0)
        n_buckets = n_buckets or saved.get("n_buckets", 8)
        loaded.append(
            ([_row_from_json(x) for x in saved.get("rows", [])], [_row_from_json(x) for x in saved.get("grid", [])])
        )
    # which sources repeat a label of an earlier one: those are compared within themselves
    labels = [{r.spec for r in rows} for rows, _ in loaded]
    repeats = [any(labels[k] & labels[j] for j in range(len(loaded)) if j != k) for k in range(len(loaded))]
    own = [any(labels[k] & labels[j] for j in range(k)) for k in range(len(loaded))]
    groups: list[tuple[list[SpecRow], list[SpecRow]]] = [([], [])]
    for k, (src_rows, src_grid) in enumerate(loaded, 1):
        if repeats[k - 1]:
            for row in src_rows + src_grid:
                row.spec, row.design = f"{row.spec}@{k}", f"{row.design or row.spec}@{k}"
        target = ([], []) if own[k - 1] else groups[0]
        target[0].extend(src_rows)
        target[1].extend(src_grid)
        if own[k - 1]:
            groups.append(target)
    rows = [r for rows_k, _ in loaded for r in rows_k]
    grid = [r for _, grid_k in loaded for r in grid_k]
    out.mkdir(parents=True, exist_ok=True)
    result = Comparison(
        rows=rows,
        out_dir=out,
        report=out / "report.md",
        seq_len=seq_len or 0,
        eval_len=eval_len or 0,
        n_buckets=n_buckets or 8,
        command=command,
        n_runs=sum(len(r.runs) for r in rows),
        jobs=1,
        grid=grid,
        mode="grid" if grid else "single",
        sources=sources,
    )
    result.verdicts = [v for g_rows, g_grid in groups for v in verdicts_of(g_rows, g_grid)]
    result.long_verdicts = [v for g_rows, _ in groups for v in verdicts_of(g_rows, metric="long_val_loss")]
    result.recipe = " ".join(f"Source {k}: {text}" for k, text in enumerate(recipes, 1) if text)
    write_files(result, None, "", started=started)
    return result
