"""``ascend-patch convert`` / ``verify`` as users type them (MindSpeed-LLM and Megatron-LM flag forms)."""

from __future__ import annotations

import os

from ascend_patch.cli import main
from loaders_tiny import hf_state


def test_mindspeed_llm_flags(tmp_path, hf_checkpoint, capsys):
    hf, _ = hf_checkpoint("qwen3")
    save = str(tmp_path / "mg")
    rc = main(["convert", "--use-mcore-models", "--model-type", "GPT", "--load-model-type", "hf",
               "--save-model-type", "mg", "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
               "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec", "--load-dir", hf,
               "--save-dir", save, "--tokenizer-model", f"{hf}/tokenizer.json", "--model-type-hf", "qwen3",
               "--params-dtype", "bf16", "--make-vocab-size-divisible-by", "64", "--verify", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "megatron legacy, TP 2, PP 2, local naming, bfloat16" in out and "verify OK" in out
    assert sorted(os.listdir(os.path.join(save, "iter_0000001"))) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    with open(os.path.join(save, "latest_checkpointed_iteration.txt")) as f:
        assert f.read() == "1"


def test_loader_saver_form_with_aliases_virtual_pipeline_and_uneven_list(tmp_path, hf_checkpoint, capsys):
    hf, _ = hf_checkpoint("llama")
    vpp = str(tmp_path / "vpp")
    assert main(["convert", "--loader", "llama_mistral", "--saver", "core", "--load-dir", hf, "--save-dir", vpp,
                 "--target-pipeline-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                 "--saver-transformer-impl", "transformer_engine"]) == 0
    assert "PP 2, VPP 2" in capsys.readouterr().out
    uneven = str(tmp_path / "uneven")
    assert main(["convert", "--loader", "mcore", "--saver", "mcore", "--load-dir", vpp, "--save-dir", uneven,
                 "--target-pipeline-parallel-size", "2", "--num-layer-list", "3,1"]) == 0
    assert "layers 3,1" in capsys.readouterr().out
    back = str(tmp_path / "hf")
    assert main(["convert", "--loader", "mcore", "--saver", "llama_hf", "--load-dir", uneven, "--save-dir", back]) == 0
    a, b = hf_state(hf), hf_state(back)
    assert set(a) == set(b) and all((a[k] == b[k]).all() for k in a)
    assert main(["verify", "--load-dir", back, "--source-dir", hf]) == 0
    assert "verify OK" in capsys.readouterr().out


def test_errors_are_clear_and_exit_2(tmp_path, hf_checkpoint, capsys):
    hf, _ = hf_checkpoint("qwen2")
    assert main(["convert", "--load-model-type", "qwen4_hf", "--load-dir", hf, "--save-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown checkpoint loader 'qwen4_hf'" in err and "qwen_hf" in err and "entry-point group" in err
    assert main(["convert", "--load-dir", hf, "--save-dir", str(tmp_path / "x"),
                 "--target-pipeline-parallel-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "4 layers cannot be split over 3 pipeline stages; use --target-pipeline-parallel-size 1, 2 or 4, or give --num-layer-list" in err
    assert not os.path.exists(tmp_path / "x")
    assert main(["convert", "--load-dir", hf, "--save-dir", str(tmp_path / "x"), "--model-type", "BERT"]) == 2


def test_progress_bar_shows_bytes(tmp_path, hf_checkpoint, capsys):
    hf, _ = hf_checkpoint("qwen3")
    assert main(["convert", "--load-dir", hf, "--save-dir", str(tmp_path / "mg"), "--progress"]) == 0
    err = capsys.readouterr().err
    import re

    # bytes done / total, elapsed, ETA and rate
    assert re.search(r"converting: 100%\|.*\| [\d.]+[kMG]?B/[\d.]+[kMG]?B \[\d\d:\d\d elapsed, ETA \d\d:\d\d, "
                     r"[\d.]+[kMG]?B/s\]", err), err


def test_verify_command_fails_on_a_broken_checkpoint(tmp_path, hf_checkpoint, capsys):
    hf, _ = hf_checkpoint("qwen3")
    out = str(tmp_path / "hf")
    assert main(["convert", "--loader", "hf", "--saver", "hf", "--load-dir", hf, "--save-dir", out,
                 "--max-shard-size", "100KB"]) == 0
    shard = sorted(n for n in os.listdir(out) if n.endswith(".safetensors"))[0]
    with open(os.path.join(out, shard), "r+b") as f:
        f.seek(os.path.getsize(os.path.join(out, shard)) - 8)
        f.write(b"\x7f" * 8)
    capsys.readouterr()
    assert main(["verify", "--load-dir", out, "--source-dir", hf]) == 1
    out_text = capsys.readouterr().out
    assert "verify FAILED" in out_text and "differ from the source" in out_text and shard in out_text


def test_hf_to_mg_never_imports_torch(tmp_path, hf_checkpoint):
    """Same-dtype hf -> mg moves bytes only: torch (seconds and ~220 MB to import) stays out of the process."""
    import json
    import subprocess
    import sys

    from loaders_tiny import child_env

    hf, _ = hf_checkpoint("qwen3")
    code = ("import json, sys\n"
            "from ascend_patch.cli import main\n"
            f"rc = main(['convert', '--load-dir', {hf!r}, '--save-dir', {str(tmp_path / 'mg')!r},"
            " '--target-tensor-parallel-size', '2', '--no-progress'])\n"
            "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(ASCEND_PATCH="0"), capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"rc": 0, "torch": False}
    assert os.path.isfile(tmp_path / "mg" / "iter_0000001" / "mp_rank_01" / "model_optim_rng.pt")


def test_empty_or_megatron_load_dir_without_the_mg_loader_says_what_to_pass(tmp_path, hf_checkpoint, capsys):
    # issue 13 item 15: both said only "no config.json at .../config.json"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["convert", "--load-dir", str(empty), "--save-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--load-dir {empty} is empty: there is no checkpoint to convert" in err and "--loader mg" in err
    hf, _ = hf_checkpoint("qwen2")
    mg = str(tmp_path / "mg")
    assert main(["convert", "--load-dir", hf, "--save-dir", mg, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["convert", "--load-dir", mg, "--save-dir", str(tmp_path / "back")]) == 2
    err = capsys.readouterr().err
    assert (f"--load-dir {mg} is a Megatron checkpoint (iter_0000001, latest_checkpointed_iteration.txt), not a "
            "Hugging Face one (no config.json); pass --loader mg (or --load-model-type mg) to read it") in err
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "back")


def test_rank_files_are_valid_zip_archives_by_default(tmp_path, hf_checkpoint, capsys):
    # issue 13 item 14: every data record had CRC-32 0, so zipfile.testzip() named archive/data/0 as corrupt
    import zipfile
    import zlib

    hf, _ = hf_checkpoint("qwen3")
    for name, flags in (("copied", []), ("cast", ["--params-dtype", "bf16"]), ("plain", ["--no-zip-crc"])):
        out = tmp_path / name  # copied: file to file in the kernel; cast: blocks through memory
        assert main(["convert", "--load-dir", hf, "--save-dir", str(out), "--target-tensor-parallel-size", "2",
                     "--target-pipeline-parallel-size", "2", "--workers", "3", "--no-progress", *flags]) == 0
        files = sorted(str(p) for p in out.rglob("model_optim_rng.pt"))
        assert len(files) == 4
        for path in files:
            with zipfile.ZipFile(path) as zf:
                records = [i for i in zf.infolist() if "/data/" in i.filename and i.file_size]
                assert len(records) > 10
                if name == "plain":
                    assert all(i.CRC == 0 for i in records)
                    continue
                assert zf.testzip() is None, path
                assert all(i.CRC == zlib.crc32(zf.read(i)) != 0 for i in records)
    capsys.readouterr()
