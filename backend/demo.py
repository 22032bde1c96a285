#!/usr/bin/env python3
"""Start the backend, load the embedded SmolLM2 GGUF and stream a chat answer."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.launcher import Backend, chat  # noqa: E402


def main() -> None:
    question = " ".join(sys.argv[1:]) or "What is the capital of France? Answer in two sentences."
    with Backend(log_path=os.environ.get("DEMO_LOG")) as backend:
        print(f"backend on {backend.addr}; loading the embedded SmolLM2-135M GGUF ...", file=sys.stderr)
        result = backend.load("")
        if not result.success:
            sys.exit(f"LoadModel failed: {result.message}")
        print(f"> {question}", file=sys.stderr)
        last = None
        for last in backend.stub.PredictStream(chat(question, Tokens=200), timeout=300):
            sys.stdout.write(last.message.decode())
            sys.stdout.flush()
        print()
        if last is not None:
            rate = last.tokens * 1000.0 / last.timing_token_generation if last.timing_token_generation else 0
            print(f"[{last.prompt_tokens} prompt tokens, {last.tokens} generated, "
                  f"first token after {last.timing_prompt_processing:.0f} ms, {rate:.1f} tok/s]", file=sys.stderr)


if __name__ == "__main__":
    main()
