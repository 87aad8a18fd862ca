"""Talk to dflash-serve (or trtllm-serve) with the official `openai` package: a completion, a chat, a stream.

    dflash-serve --port 8000 &                     # the embedded SmolLM2-135M pair, on the CPU
    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1] [--api-key KEY]

pip install openai. The `dflash` object in each response (steps, drafted, accepted, tau) is a dflash-serve
extension; `top_k` and `ignore_eos` go through `extra_body`.
"""
from __future__ import annotations

import argparse
import os

from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    p.add_argument("--api-key", default=os.environ.get("DFLASH_API_KEY", "none"),
                   help="the server's --api-key (any string when it has none)")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    print(f"model: {model}\n")

    # 1. a plain completion, greedy (temperature 0): the target model's own output, token for token
    r = client.completions.create(model=model, prompt="The three primary colors are", max_tokens=args.max_tokens,
                                  temperature=0, stop=["\n\n"])
    print("completion:", r.choices[0].text.strip())
    print(f"  finish {r.choices[0].finish_reason}, usage {r.usage.prompt_tokens} + {r.usage.completion_tokens} "
          f"tokens, DFlash {(r.model_extra or {}).get('dflash')}\n")

    # 2. a chat completion (the model's chat template is applied by the server), seeded sampling
    r = client.chat.completions.create(
        model=model, max_tokens=args.max_tokens, temperature=0.7, top_p=0.9, seed=42,
        messages=[{"role": "system", "content": "You are a concise assistant."},
                  {"role": "user", "content": "Give me one tip for writing fast Python."}],
        extra_body={"top_k": 50})
    print("chat:", r.choices[0].message.content.strip())
    print(f"  tau {(r.model_extra or {}).get('dflash', {}).get('tau')}\n")

    # 3. streaming chat: server-sent events, printed as they come; usage in a last chunk
    print("stream: ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model, max_tokens=args.max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Count from one to ten in words."}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n  usage {chunk.usage.prompt_tokens} + {chunk.usage.completion_tokens} tokens")


if __name__ == "__main__":
    main()
