"""Where the converter writes: --force leaves exactly the new checkpoint; bad destinations are refused first."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ascend_patch.cli import main
from loaders_tiny import hf_state, make_model, save_model


def _from_pretrained_state(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("first,second,exchange", [("sharded", "single", True), ("single", "sharded", True),
                                                    ("single", "sharded", False)])
def test_force_into_an_hf_dir_leaves_exactly_the_new_checkpoint(tmp_path, capsys, monkeypatch, first, second,
                                                                 exchange):
    # issue 13 item 8: the other weight layout stayed behind and from_pretrained loaded the stale one
    if not exchange:  # a kernel or file system without renameat2(RENAME_EXCHANGE): two renames
        monkeypatch.setattr("ascend_patch.loaders.publish._exchange", lambda a, b: False)
    old = save_model(make_model("llama", seed=1), str(tmp_path / "old"))
    new = save_model(make_model("llama", seed=2), str(tmp_path / "new"))
    out = tmp_path / "out"
    size = {"sharded": "60KB", "single": "5GB"}
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", old, "--save-dir", str(out),
                 "--max-shard-size", size[first], "--no-progress"]) == 0
    (out / "tokenizer.json").write_text("{}")  # not a checkpoint file: kept
    capsys.readouterr()
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", new, "--save-dir", str(out),
                 "--max-shard-size", size[second], "--force", "--verify", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "verify OK" in text and "kept 1 entry that belong to no checkpoint: tokenizer.json" in text
    entries = sorted(os.listdir(out))
    weights = [e for e in entries if e.endswith((".safetensors", ".json")) and e not in ("config.json",
                                                                                        "tokenizer.json",
                                                                                        "generation_config.json")]
    if second == "single":
        assert weights == ["model.safetensors"]
    else:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 1 and weights == sorted(shards + ["model.safetensors.index.json"])
    assert "tokenizer.json" in entries
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch")]
    got, want = _from_pretrained_state(str(out)), hf_state(new)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_verify_reads_the_file_transformers_loads(tmp_path, capsys):
    # a stale model.safetensors beside shards + index: transformers loads it, so verify must too
    src = save_model(make_model("llama", seed=2), str(tmp_path / "src"))
    out = tmp_path / "out"
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", src, "--save-dir", str(out),
                 "--max-shard-size", "60KB", "--no-progress"]) == 0
    stale = save_model(make_model("llama", seed=1), str(tmp_path / "stale"))
    os.link(os.path.join(stale, "model.safetensors"), out / "model.safetensors")
    capsys.readouterr()
    assert main(["verify", "--load-dir", str(out), "--source-dir", src]) == 1
    text = capsys.readouterr().out
    assert "verify FAILED" in text
    assert f"{out} holds model-00001-of-" in text and "besides model.safetensors, which transformers loads" in text
    assert "tensor(s) differ from the source" in text  # it compared model.safetensors, not the shards


def _refusal(tmp_path, capsys, save_dir, *extra):
    """Convert the session's tiny model into ``save_dir``: the exit code and stderr."""
    src = tmp_path / "src"
    if not src.exists():
        save_model(make_model("qwen2"), str(src))
    code = main(["convert", "--load-dir", str(src), "--save-dir", str(save_dir), "--no-progress", *extra])
    return code, capsys.readouterr().err


def test_destinations_that_would_fail_after_the_work_are_refused_first(tmp_path, capsys, monkeypatch):
    # issue 13 item 11: each of these ended in a traceback after the whole conversion, with exit 1
    # (which the docs reserve for a failed verification)
    import ascend_patch.loaders.engine as engine

    calls = []
    monkeypatch.setattr(engine, "_write_all", lambda *a, **k: calls.append(a) or 0)  # no work may start
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    code, err = _refusal(tmp_path, capsys, link)
    assert code == 2 and (f"--save-dir {link} is a symbolic link (to {real}): the output directory is moved into "
                          f"place, which would replace the link, not fill its target; give the real path, "
                          f"--save-dir {real}") in err
    regular = tmp_path / "file.txt"
    regular.write_text("x")
    code, err = _refusal(tmp_path, capsys, regular / "sub" / "out")
    assert code == 2 and f"--save-dir {regular}/sub/out is below {regular}, which is a regular file" in err
    if os.path.ismount("/dev/shm"):
        code, err = _refusal(tmp_path, capsys, "/dev/shm", "--force")
        assert code == 2 and ("--save-dir /dev/shm is a mount point: the output is assembled beside it and moved "
                              "into place, which cannot cross file systems; write into a directory inside it, e.g. "
                              "--save-dir /dev/shm/ckpt") in err
    if os.path.ismount("/sys"):
        code, err = _refusal(tmp_path, capsys, "/sys/ascend_patch_out")  # sysfs refuses new entries, even to root
        assert code == 2 and "--save-dir /sys/ascend_patch_out: cannot create directories in /sys (" in err
    # a read-only file system (a container cannot mount one for the test: statvfs says so here)
    target = tmp_path / "ro"
    target.mkdir()
    statvfs = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: type("S", (), {"f_flag": os.ST_RDONLY})() if str(p) == str(target)
                        else statvfs(p))
    code, err = _refusal(tmp_path, capsys, target / "out")
    assert code == 2 and (f"--save-dir {target}/out: {target} is on a read-only file system; choose a --save-dir "
                          "on a writable file system") in err
    assert calls == [] and "Traceback" not in err
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch")]


def test_force_never_replaces_a_directory_holding_the_source(tmp_path, capsys):
    outer = tmp_path / "outer"
    save_model(make_model("qwen2"), str(outer / "src"))
    code = main(["convert", "--load-dir", str(outer / "src"), "--save-dir", str(outer), "--force", "--no-progress"])
    assert code == 2
    assert (f"--load-dir {outer}/src is inside --save-dir {outer}, which --force replaces"
            in capsys.readouterr().err)
    assert os.path.isfile(outer / "src" / "model.safetensors")


def test_a_file_system_error_while_writing_is_a_refusal_not_a_traceback(tmp_path, capsys, monkeypatch):
    import ascend_patch.loaders.engine as engine

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "out"))

    monkeypatch.setattr(engine, "_write_all", fail)
    code, err = _refusal(tmp_path, capsys, tmp_path / "out")
    assert code == 2
    assert err.strip().splitlines()[-1] == (f"ascend-patch convert: No space left on device: {tmp_path}/out; the partial output was "
                           "removed")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_config_naming_its_weights_file_is_read_by_that_name_and_not_copied(tmp_path, capsys):
    # transformers 5 reads config.json's transformers_weights first; the converter must read the same file,
    # and must not copy the name into an output whose weights file is another
    src = save_model(make_model("llama", seed=3), str(tmp_path / "src"), max_shard_size="60KB")
    stale = save_model(make_model("llama", seed=4), str(tmp_path / "stale"))
    os.link(os.path.join(stale, "model.safetensors"), os.path.join(src, "model.safetensors"))
    config = json.loads(open(os.path.join(src, "config.json")).read())
    config["transformers_weights"] = "model.safetensors.index.json"
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(config, f)
    out = tmp_path / "out"
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", src, "--save-dir", str(out),
                 "--no-progress"]) == 2  # model.safetensors is beside the named index: stale, refused
    assert "besides model.safetensors.index.json, which transformers loads" in capsys.readouterr().err
    os.unlink(os.path.join(src, "model.safetensors"))
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", src, "--save-dir", str(out),
                 "--no-progress", "--verify"]) == 0
    assert "verify OK" in capsys.readouterr().out
    assert "transformers_weights" not in json.loads((out / "config.json").read_text())
    got, want = _from_pretrained_state(str(out)), hf_state(src)
    assert all(torch.equal(got[k], want[k]) for k in want)


def _can_mount_read_only() -> bool:
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o ro none /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs unprivileged user and mount namespaces (unshare -rm)")
def test_a_real_read_only_file_system_is_refused_before_any_work(tmp_path):
    import shlex
    import subprocess
    import sys

    from loaders_tiny import child_env

    src = save_model(make_model("qwen2"), str(tmp_path / "src"))
    ro = tmp_path / "ro"
    ro.mkdir()
    convert = [sys.executable, "-m", "ascend_patch.cli", "convert", "--load-dir", src, "--save-dir",
               str(ro / "out"), "--no-progress"]
    script = f"mount -t tmpfs -o ro none {shlex.quote(str(ro))} && exec {shlex.join(convert)}"
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                          env=child_env(ASCEND_PATCH="0"))
    assert proc.returncode == 2, proc.stderr
    assert (f"--save-dir {ro}/out: {ro} is on a read-only file system; choose a --save-dir on a writable file "
            "system") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_current_directory_and_an_overlong_name_are_refused_first(tmp_path, capsys, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    (here / "notes.txt").write_text("x")
    monkeypatch.chdir(here)
    code, err = _refusal(tmp_path, capsys, ".", "--force")
    assert code == 2 and ("--save-dir . holds the current directory: the output replaces that directory with a new "
                          "one, which would leave this shell in a deleted directory; cd out of it first") in err
    assert sorted(os.listdir(here)) == ["notes.txt"]
    name = "x" * 300
    code, err = _refusal(tmp_path, capsys, tmp_path / name)
    assert code == 2 and f"the name {'x' * 40}... is 300 bytes; the file system allows 255" in err


def test_other_weight_names_beside_transformers_own_are_not_stale(tmp_path, capsys):
    # Mistral's hub repos ship consolidated.safetensors beside model-0000K-of-0000N shards + index
    src = save_model(make_model("llama", seed=5), str(tmp_path / "src"), max_shard_size="60KB")
    stale = save_model(make_model("llama", seed=6), str(tmp_path / "stale"))
    os.link(os.path.join(stale, "model.safetensors"), os.path.join(src, "consolidated.safetensors"))
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", src, "--save-dir",
                 str(tmp_path / "out"), "--no-progress", "--verify"]) == 0
    assert "verify OK" in capsys.readouterr().out


def test_a_conversion_never_replaces_a_save_dir_another_one_published_meanwhile(tmp_path, hf_checkpoint):
    """Two runs into one new --save-dir, the second finishing first (deterministic: it runs inside the first's
    progress callback): the first must not silently replace the second's checkpoint without --force."""
    from ascend_patch.loaders import ConvertOptions, convert
    from ascend_patch.loaders.publish import OutputAppeared

    hf, _ = hf_checkpoint("qwen3")
    out = tmp_path / "out"

    def the_tp2_run_finishes_first(event, info):
        if event == "start":
            convert(hf, str(out), "hf", "mg", ConvertOptions(target_tp=2))

    with pytest.raises(OutputAppeared) as info:
        convert(hf, str(out), "hf", "mg", ConvertOptions(target_tp=1), on_progress=the_tp2_run_finishes_first)
    assert str(info.value) == (
        f"--save-dir {out} was created by another process while this conversion ran and now holds 2 entries: "
        "iter_0000001, latest_checkpointed_iteration.txt (a second conversion into the same directory?); it was not "
        "replaced, and this conversion's output was removed; check which run's checkpoint it holds; pass --force to "
        "replace it, or convert into another --save-dir")
    assert sorted(os.listdir(out / "iter_0000001")) == ["mp_rank_00", "mp_rank_01"]  # the TP2 checkpoint, whole
    assert os.listdir(tmp_path) == ["out"]  # the TP1 run's staging directory is gone
    # with --force the same interleaving replaces it, as asked
    convert(hf, str(out), "hf", "mg", ConvertOptions(target_tp=1, force=True),
            on_progress=lambda event, info: None)
    assert sorted(os.listdir(out / "iter_0000001")) == ["mp_rank_00"]


def test_two_concurrent_conversions_into_one_new_dir_one_wins(tmp_path, hf_checkpoint):
    """Two real `ascend-patch convert` processes (TP1 and TP2) into the same new --save-dir: one exits 0, the
    other 2 (refused at preflight or at publishing, whichever the timing gives), and the directory holds the
    winner's checkpoint, whole."""
    import subprocess
    import sys

    from helpers import child_env

    hf, _ = hf_checkpoint("qwen3")
    out = tmp_path / "out"
    procs = {tp: subprocess.Popen([sys.executable, "-m", "ascend_patch.cli", "convert", "--load-dir", hf,
                                   "--save-dir", str(out), "--target-tensor-parallel-size", str(tp), "--no-progress"],
                                  env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tp in (1, 2)}
    results = {tp: (p.wait(timeout=300), p.stderr.read()) for tp, p in procs.items()}
    codes = sorted(code for code, _ in results.values())
    assert codes == [0, 2], results
    winner = next(tp for tp, (code, _) in results.items() if code == 0)
    loser_err = next(err for code, err in results.values() if code == 2)
    assert "--save-dir" in loser_err and ("was created by another process" in loser_err or "is not empty" in loser_err)
    assert sorted(os.listdir(out / "iter_0000001")) == [f"mp_rank_{t:02d}" for t in range(winner)]
    assert os.listdir(tmp_path) == ["out"]  # no staging directory left behind by the refused run
