"""Children of multiprocessing's spawn start method are patched before they re-import the main script."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ascend_patch.patching.processes import patched_command_line

from helpers import child_env

SCRIPT = textwrap.dedent('''
    import multiprocessing as mp
    import torch

    # module level: a spawn child runs this again (as __mp_main__) before its target
    AT_IMPORT = (torch.cuda.is_available(), str(torch.zeros(1, device="cuda").device))

    def child(queue):
        queue.put(AT_IMPORT)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        print("CHILD", queue.get(timeout=120))
        proc.join()
        print("EXIT", proc.exitcode)
''')


def test_a_spawn_child_reimports_the_main_script_patched(tmp_path):
    script = tmp_path / "main.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "ascend_patch", str(script)], cwd=tmp_path,
                          env=child_env(ASCEND_PATCH_DEVICE="cpu"), capture_output=True, text=True, timeout=300)
    assert "CHILD (True, 'cpu')" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "EXIT 0" in done.stdout


def test_the_command_line_applies_first_with_the_parents_settings():
    stock = ["/usr/bin/python3", "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=5)",
             "--multiprocessing-fork"]
    env = {"ASCEND_PATCH": "1", "ASCEND_PATCH_DEVICE": "cpu"}
    cmd = patched_command_line(stock, env)
    assert cmd[:3] == stock[:3] and cmd[4:] == stock[4:]
    code = cmd[3]
    assert code.endswith(stock[3]) and code.index("ascend_patch.apply()") < code.index("spawn_main")
    assert repr(env) in code
    compile(code, "<spawn>", "exec")  # valid Python
    frozen = ["/opt/app", "--multiprocessing-fork", "pipe_handle=5"]
    assert patched_command_line(frozen, env) == frozen
