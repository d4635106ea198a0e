"""A stand-in harness for the tests: reads the task and its endpoint the way CLI harnesses do.

``python fake_harness.py MODE [TASK]``; modes (comma-separated): ``calls`` (a side call, then two
policy calls), ``env`` (print the environment as JSON), ``net`` (report what it can reach),
``daemon`` (leave a detached process touching ``beat`` in the working directory), ``hang`` (sleep),
``fail`` (exit 3). The task comes from argv, stdin or ``$AGL_TASK_FILE``, whichever has it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def chat(model: str, text: str) -> str:
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["choices"][0]["message"]["content"]


def reach(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=2):
            return "connected"
    except OSError as exc:
        return type(exc).__name__


def main() -> int:
    modes = sys.argv[1].split(",")
    task = sys.argv[2] if len(sys.argv) > 2 else ""
    if not task and not sys.stdin.isatty():
        task = sys.stdin.read()
    if not task and os.path.exists(os.environ.get("AGL_TASK_FILE", "")):
        task = open(os.environ["AGL_TASK_FILE"]).read()
    out: dict[str, object] = {"task": task, "cwd": os.getcwd(), "files": sorted(os.listdir("."))}
    if "calls" in modes:
        out["title"] = chat(os.environ["AGL_SIDE_MODEL"], "title: " + task)
        out["replies"] = [chat(os.environ["AGL_MODEL"], task), chat(os.environ["AGL_MODEL"], task + " again")]
    if "env" in modes:
        out["env"] = dict(os.environ)
    if "net" in modes:
        out["interfaces"] = [
            line.split(":", 1)[0].strip() for line in open("/proc/self/net/dev").read().splitlines()[2:]
        ]
        out["reach"] = {f"{h}:{p}": reach(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[3:])}
    if "daemon" in modes:
        beat = os.path.abspath("beat")
        code = f"import time\nwhile True:\n    open({beat!r}, 'a').write('.')\n    time.sleep(0.1)\n"
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True)  # escapes the process group
        open("answer.txt", "w").write("done")
    print(json.dumps(out))
    sys.stdout.flush()
    if "hang" in modes:
        time.sleep(600)
    return 3 if "fail" in modes else 0


if __name__ == "__main__":
    sys.exit(main())
