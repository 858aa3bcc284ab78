"""The demo's emulators in a process of their own: they answer in their exact wire formats,
the process is gone when the block ends, and a parent killed outright takes it along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import openai
import psutil

from kvmigrate.embedded import HOSTED_MODEL, VLLM_MODEL, emulated_backends


def _children() -> set[int]:
    """Spawned children, not multiprocessing's resource tracker (it outlives any block)."""
    return {
        child.pid
        for child in psutil.Process().children(recursive=True)
        if "spawn_main" in " ".join(child.cmdline())
    }


def test_both_emulators_answer_and_their_process_ends_with_the_block() -> None:
    before = _children()
    with emulated_backends(time_scale=0.0, own_process=True) as backends:
        started = _children() - before
        assert len(started) == 1, "the emulators run in a child process"
        for url, model in ((backends.hosted_url, HOSTED_MODEL), (backends.vllm_url, VLLM_MODEL)):
            with openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0) as client:
                answer = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hello"}]
                )
            assert answer.model == model
            assert answer.choices[0].message.content
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in started), "the child outlived the block"  # fmt: skip


PARENT = textwrap.dedent(
    """
    import os, sys, time
    from kvmigrate.embedded import emulated_backends

    if __name__ == "__main__":
        with emulated_backends(time_scale=0.0, own_process=True) as backends:
            import psutil
            child = next(p.pid for p in psutil.Process().children()
                         if "spawn_main" in " ".join(p.cmdline()))
            print(child, backends.hosted_url, flush=True)
            time.sleep(600)
    """
)


def test_a_parent_killed_outright_takes_the_emulators_with_it(tmp_path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        assert line, "the parent printed its child"
        child = int(line.split()[0])
        assert psutil.pid_exists(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.pid_exists(child):
            if psutil.Process(child).status() == "zombie":
                break
            time.sleep(0.05)
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    finally:
        if parent.poll() is None:
            parent.kill()
        if parent.stdout:
            parent.stdout.close()
