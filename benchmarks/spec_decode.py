"""Speculative decoding (n-gram proposer, a draft model or an EAGLE head) against plain decoding, on the same engine
and requests.

    python -m benchmarks.spec_decode [--model small] [--num-requests 8] [--max-tokens 128] [--repeats 3]
                                     [--draft-layers N | --draft-model PATH | --eagle-head PATH|copying]

Greedy requests whose prompts repeat text (a passage quoted twice, as in summarising or editing, where
prompt lookup pays off) run through ``engine.LLM`` with ``speculative_config`` = n-gram at 1, 3 and 5 draft
tokens and without it, in one process with one torch thread, alternating, the median of ``--repeats`` each.
The generated default model has random weights, so its greedy outputs repeat themselves after a while, and
the proposer finds them too. Both runs produce the same tokens (checked); the columns are output tokens per
second, the ratio to plain decoding, the acceptance rate and the tokens a verified draft produced on average.
``--draft-layers N`` adds a draft model cut from the target's first N layers (engine/models/layer_skip_draft.py) at
1, 3 and 5 drafts; ``--draft-model PATH`` one of the same vocabulary; ``--eagle-head PATH`` an EAGLE head's folder,
or ``copying`` for a head generated for the model whose features are the target's own (it drafts the last token again:
what a head costs, accepted where the random model repeats a token).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="a generated default model name or a checkpoint folder")
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="the engine's batch (decode steps run this many)")
    parser.add_argument("--repeats", type=int, default=3)
    drafts = parser.add_mutually_exclusive_group()
    drafts.add_argument("--draft-layers", type=int, help="also draft with the target's first N layers")
    drafts.add_argument("--draft-model", help="also draft with this checkpoint (the target's vocabulary)")
    drafts.add_argument("--eagle-head", help="also draft with this EAGLE head, or 'copying' (one made for the model)")
    args = parser.parse_args(argv)

    import torch

    from engine import LLM, SamplingParams

    torch.set_num_threads(1)
    rng = random.Random(0)
    prompts = []
    for _ in range(args.num_requests):
        passage = [rng.randrange(10, 4000) for _ in range(96)]
        prompts.append(passage + [rng.randrange(10, 4000) for _ in range(16)] + passage[:48])
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    settings = {"plain": None}
    for drafts in (1, 3, 5):
        settings[f"ngram k={drafts}"] = {"method": "ngram", "num_speculative_tokens": drafts,
                                          "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    draft_model = args.draft_model
    if args.draft_layers is not None:
        import tempfile

        from engine.engine_args import EngineArgs
        from engine.models.layer_skip_draft import write_layer_skip_draft

        target = EngineArgs(model=args.model).resolve_model_path()
        draft_model = str(write_layer_skip_draft(target, tempfile.mkdtemp() + "/draft", args.draft_layers))
    if draft_model is not None:
        for drafts in (1, 3, 5):
            settings[f"draft k={drafts}"] = {"method": "draft_model", "model": draft_model,
                                             "num_speculative_tokens": drafts}
    head = args.eagle_head
    if head == "copying":
        import tempfile

        from engine.engine_args import EngineArgs
        from engine.models.eagle import make_eagle_head

        head = str(make_eagle_head(EngineArgs(model=args.model).resolve_model_path(), tempfile.mkdtemp() + "/head",
                                   copying=True))
    if head is not None:
        for drafts in (1, 3, 5):
            settings[f"eagle k={drafts}"] = {"method": "eagle", "model": head, "num_speculative_tokens": drafts}
    engines = {name: LLM(model=args.model, skip_tokenizer_init=True, max_num_seqs=args.max_num_seqs,
                         speculative_config=config) for name, config in settings.items()}
    times: dict[str, list[float]] = {name: [] for name in settings}
    outputs = {}
    for _ in range(args.repeats):
        for name, llm in engines.items():
            llm.engine_core.scheduler.reset_prefix_cache()  # every repeat computes its prompts, as the first did
            started = time.perf_counter()
            results = llm.generate(prompts, params, use_tqdm=False)
            times[name].append(time.perf_counter() - started)
            outputs[name] = [result.outputs[0].token_ids for result in results]
    num_tokens = args.num_requests * args.max_tokens
    plain = statistics.median(times["plain"])
    print(f"{args.num_requests} requests x {args.max_tokens} tokens, greedy, model {args.model}, 1 thread, "
          f"median of {args.repeats}")
    print(f"{'setting':<12} {'tokens/s':>9} {'vs plain':>9} {'same tokens':>12} {'acceptance':>11} {'tokens/draft':>13}")
    for name, llm in engines.items():
        seconds = statistics.median(times[name])
        stats = llm.engine_core.scheduler.make_stats().spec_decoding
        acceptance = f"{stats['acceptance_rate']:.2f}" if stats else "-"
        per_draft = f"{stats['mean_acceptance_length']:.2f}" if stats else "-"
        print(f"{name:<12} {num_tokens / seconds:>9.1f} {plain / seconds:>8.2f}x {str(outputs[name] == outputs['plain']):>12} "
              f"{acceptance:>11} {per_draft:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
