"""`make demo`: the daemon's tour. Starts `deepserve up` on a free loopback port, streams a chat
completion through the official `openai` client (tokens print as they arrive), prints
`deepserve status`, stops the daemon with SIGTERM and runs `deepserve replay verify` on its log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 60


def main() -> int:
    import openai

    run_dir = Path("runs") / time.strftime("demo-%Y%m%dT%H%M%SZ", time.gmtime())
    deepserve = [sys.executable, "-m", "deepserve"]
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "daemon.log"  # the daemon's structlog lines, kept out of the streamed text
    print(f"$ deepserve up --port 0 --run-dir {run_dir} 2> {log_path}", flush=True)
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([*deepserve, "up", "--port", "0", "--run-dir", str(run_dir)], stderr=log_file)
    try:
        info_path, end = run_dir / "daemon.json", time.monotonic() + START_TIMEOUT_S
        while not info_path.exists():
            if proc.poll() is not None or time.monotonic() > end:
                print(f"demo: the daemon did not start; its log:\n{log_path.read_text()}", file=sys.stderr)
                return 1
            time.sleep(0.05)
        info = json.loads(info_path.read_text())
        client = openai.OpenAI(base_url=info["url"] + "/v1", api_key="none")
        question = "Tell me about the river, the mountain and the quiet garden."
        print(f"\nuser: {question}\nassistant: ", end="", flush=True)
        stream = client.chat.completions.create(
            model="llama3-8b", messages=[{"role": "user", "content": question}], max_tokens=60, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                print(choice.delta.content or "", end="", flush=True)
        print(f"\n\nusage: {usage.model_dump() if usage else None}\n", flush=True)
        print("$ deepserve status", flush=True)
        subprocess.run([*deepserve, "status", "--admin-url", info["admin_url"]], check=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    print(f"\n$ tail -n 3 {log_path}\n" + "".join(log_path.read_text().splitlines(True)[-3:]), end="")
    print(f"\n$ deepserve replay verify {info['log']}", flush=True)
    return subprocess.run([*deepserve, "replay", "verify", info["log"]]).returncode


if __name__ == "__main__":
    raise SystemExit(main())
