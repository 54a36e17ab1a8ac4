"""A save killed at any instant leaves the old checkpoint or the new one, complete, and no temporary files.

``save`` writes ``model.safetensors`` and ``spec.json``; renaming them one after the other used to leave, after a
SIGKILL between the two renames, a folder that ``load`` refused ("spec.json differs from the spec stored in
model.safetensors"): the old checkpoint lost, the new one unusable, and ``.tmp`` files piling up. Real
processes (``os.fork``) are killed here before every named step of the protocol (the fault-injection hook
:func:`modkit.io.atomic.on_step`) and before every file-system call it makes: every kill point is chosen, none is a
timed instant, so the outcome of each kill is known in advance and asserted.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

import modkit
from modkit.io import atomic
from modkit.io.atomic import JOURNAL

from conftest import tiny_spec

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture(scope="module")
def two_models():
    """Two models that differ in their spec (name, d_ff) and in every weight."""
    a = modkit.build(tiny_spec(name="model-a"), seed=1)
    b = modkit.build(tiny_spec(name="model-b", block__ffn={"type": "swiglu", "d_ff": 96}), seed=2)
    return {"model-a": a, "model-b": b}


def _same(model, reference) -> bool:
    got, want = model.state_dict(), reference.state_dict()
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def _check_folder(folder, models) -> str:
    """Load ``folder``; it must be one of ``models`` exactly. Afterwards no temporary file or journal is left."""
    loaded = modkit.load(folder)
    name = loaded.spec.name
    assert name in models, name
    assert _same(loaded, models[name]), f"{name}: weights differ from the model saved under that name"
    assert modkit.load_spec(folder / "spec.json").name == name  # the readable copy matches too
    left = sorted(p.name for p in folder.iterdir() if p.name not in ("spec.json", "model.safetensors"))
    assert not left, left
    return name


def _run_child(body) -> int:
    """Fork; the child runs ``body()`` and exits without returning into pytest. Returns the child's pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            body()
        finally:
            os._exit(0)
    return pid


def _steps_of_a_save(model, folder) -> list[str]:
    """The named steps (:func:`modkit.io.atomic.on_step`) of one save of ``model`` into ``folder``, in order."""
    steps: list[str] = []
    with atomic.on_step(lambda step, where: steps.append(step)):
        modkit.save(model, folder)
    return steps


@pytest.mark.parametrize("old, new", [("model-a", "model-b"), ("model-b", "model-a")])
def test_a_save_stopped_at_each_of_its_steps_leaves_old_or_new(tmp_path, two_models, old, new):
    """A child process saving ``new`` over ``old`` is SIGKILLed just before its k-th step, for every k in turn
    (chosen through the fault-injection hook, never by timing): up to the commit point the folder loads as
    ``old``, past it as ``new``, and after the load nothing temporary is left."""
    folder = tmp_path / "ckpt"
    modkit.save(two_models[old], folder)
    steps = _steps_of_a_save(two_models[new], folder)
    commit = steps.index(atomic.COMMIT_STEP)
    # every file is staged, written and fsynced before the commit; the moves come after it
    for name in ("model.safetensors", "spec.json", JOURNAL):
        assert steps.index(f"stage {name}") < steps.index(f"write {name}") < steps.index(f"fsync {name}") < commit, (
            steps
        )
    assert steps.index("move model.safetensors") > commit and steps.index("move spec.json") > commit, steps
    outcomes = []
    for k, step in enumerate(steps):
        modkit.save(two_models[old], folder)

        def save_and_die(k=k):
            count = iter(range(len(steps)))

            def hook(name, where):
                if next(count) == k:
                    os.kill(os.getpid(), signal.SIGKILL)

            with atomic.on_step(hook):
                modkit.save(two_models[new], folder)
            os._exit(3)  # not reached: step k exists

        pid = _run_child(save_and_die)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (step, status)
        outcomes.append((step, _check_folder(folder, two_models)))
    # killed just before the journal's rename (the commit point) or earlier: the old checkpoint; after it: the new one
    assert [name for _, name in outcomes] == [old] * (commit + 1) + [new] * (len(steps) - commit - 1), outcomes


#: the protocol's file-system calls; the child dies just before the n-th of them
STEPS = ("replace", "fsync", "unlink")


def _kill_at(n: int):
    """Patch ``os`` so that the process SIGKILLs itself when it is about to make its n-th file-system step."""
    count = [0]

    def wrap(fn):
        def step(*args, **kwargs):
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return step

    for name in STEPS:
        setattr(os, name, wrap(getattr(os, name)))
    import pathlib

    original_unlink = pathlib.Path.unlink

    def unlink(self, missing_ok=False):
        count[0] += 1
        if count[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return original_unlink(self, missing_ok=missing_ok)

    pathlib.Path.unlink = unlink


def test_a_kill_before_every_step_of_a_save_leaves_old_or_new(tmp_path, two_models):
    """Deterministic: die before the 1st, 2nd, ... file-system call of one save; past the commit point the new
    checkpoint must win, before it the old one."""
    folder = tmp_path / "ckpt"
    outcomes = []
    n = 1
    while True:
        modkit.save(two_models["model-a"], folder)

        def save_and_die(n=n):
            _kill_at(n)
            modkit.save(two_models["model-b"], folder)
            os._exit(3)  # the save finished before step n: n is past the last step

        pid = _run_child(save_and_die)
        _, status = os.waitpid(pid, 0)
        finished = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3
        if not finished:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        committed = (folder / JOURNAL).exists()
        outcomes.append((n, committed, _check_folder(folder, two_models)))
        if finished:
            break
        n += 1
        assert n < 100, "the save never finished"
    assert outcomes[-1][2] == "model-b"
    # every kill after the journal was committed rolls forward to the new checkpoint
    assert all(name == "model-b" for _, committed, name in outcomes if committed), outcomes
    # and there were kills on both sides of the commit point
    names = [name for _, _, name in outcomes]
    assert "model-a" in names and any(c for _, c, _ in outcomes), outcomes


def test_temporaries_of_a_killed_save_are_removed_by_the_next_save(tmp_path, two_models):
    folder = tmp_path / "ckpt"
    modkit.save(two_models["model-a"], folder)

    def die_after_writing_weights():
        _kill_at(2)  # after the weights' fsync, before the spec's: a weights temporary is left behind
        modkit.save(two_models["model-b"], folder)

    pid = _run_child(die_after_writing_weights)
    os.waitpid(pid, 0)
    leftovers = [p.name for p in folder.iterdir() if p.name not in ("model.safetensors", "spec.json")]
    assert leftovers and all(n.startswith(f".modkit-tmp.{pid}.") for n in leftovers), leftovers
    modkit.save(two_models["model-b"], folder)
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "spec.json"]
    assert _check_folder(folder, two_models) == "model-b"


def test_temporaries_of_a_live_writer_are_kept(tmp_path, two_models):
    """Recovery never deletes the files of a save still running in another process."""
    folder = tmp_path / "ckpt"
    modkit.save(two_models["model-a"], folder)
    mine = folder / f".modkit-tmp.{os.getppid()}.abc123"  # the parent of this test process is alive
    mine.mkdir()
    (mine / "model.safetensors").write_bytes(b"partial")
    modkit.load(folder)
    assert (mine / "model.safetensors").exists()


def test_export_to_hugging_face_is_atomic_too(tmp_path):
    """to_hf replaces config.json and the weights (and removes an earlier export's shards) in one step."""
    spec = modkit.from_hf_config(_llama_config())
    first, second = modkit.build(spec, seed=3), modkit.build(spec, seed=4)
    folder = tmp_path / "hf"
    for n in range(1, 40):
        modkit.to_hf(first, folder, max_shard_size=20_000)  # sharded: index + shards

        def export_and_die(n=n):
            _kill_at(n)
            modkit.to_hf(second, folder)  # one file: the old shards and index must go in the same step
            os._exit(3)

        pid = _run_child(export_and_die)
        _, status = os.waitpid(pid, 0)
        loaded = modkit.from_hf(folder)  # recovers first
        names = sorted(p.name for p in folder.iterdir())
        if _same(loaded, second):
            assert names == ["config.json", "model.safetensors"], (n, names)
        else:
            assert _same(loaded, first), n
            assert "model.safetensors" not in names and "model.safetensors.index.json" in names, (n, names)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
            assert _same(loaded, second)
            break
    else:
        pytest.fail("the export never finished")


def _llama_config() -> dict:
    return {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }


def test_a_tampered_journal_is_refused_not_followed(tmp_path, two_models):
    """A journal naming files outside its folder is an error, never a rename."""
    import json

    folder = tmp_path / "ckpt"
    modkit.save(two_models["model-a"], folder)
    (folder / JOURNAL).write_text(json.dumps({"moves": [["../../elsewhere", "spec.json"]], "remove": []}))
    with pytest.raises(modkit.CheckpointError, match="malformed commit journal"):
        modkit.load(folder)
    (folder / JOURNAL).write_text("[1, 2")
    with pytest.raises(modkit.CheckpointError, match="unreadable commit journal"):
        modkit.load(folder)


def test_a_reader_that_cannot_write_still_sees_the_committed_checkpoint(tmp_path, two_models, monkeypatch):
    """Past the commit point, a reader without write access reads the new files from where they wait."""
    import modkit.io.atomic as atomic

    folder = tmp_path / "ckpt"
    modkit.save(two_models["model-a"], folder)
    real = os.replace
    monkeypatch.setattr(
        atomic.os,
        "replace",
        lambda src, dst: real(src, dst) if str(dst).endswith(JOURNAL) else (_ for _ in ()).throw(OSError("disk gone")),
    )
    with pytest.raises(OSError):
        modkit.save(two_models["model-b"], folder)  # committed, then the first move failed
    monkeypatch.setattr(atomic.os, "replace", lambda src, dst: (_ for _ in ()).throw(PermissionError("read-only")))
    assert _same(modkit.load(folder), two_models["model-b"])
    monkeypatch.setattr(atomic.os, "replace", real)
    assert _check_folder(folder, two_models) == "model-b"  # a writable reader finishes the step
