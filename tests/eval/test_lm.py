"""The lm-eval adapter over a real committed checkpoint: batch-size invariance (1 vs 8 within 1e-5), scores
equal to tidal's own forward pass, and greedy generation, through real ``lm_eval.api.instance.Instance``s."""

from __future__ import annotations

import json

import numpy as np
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM

from tidal.eval.build_tasks import TASKS_DIR
from tidal.eval.lm import TidalLM


def _items(task: str, n: int) -> list[dict]:
    return [json.loads(line) for line in (TASKS_DIR / f"{task}.jsonl").open()][:n]


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_is_an_lm_eval_model(trained):
    assert isinstance(TidalLM(trained), LM)


def test_loglikelihood_batch_1_and_8_agree(trained):
    pairs = [(it["context"], " " + c) for it in _items("tidal_brown_cloze", 5) for c in it["choices"]]  # 20
    one = TidalLM(trained, batch_size=1).loglikelihood(_requests("loglikelihood", pairs))
    eight = TidalLM(trained, batch_size=8).loglikelihood(_requests("loglikelihood", pairs))
    assert len(one) == len(eight) == 20
    assert np.allclose([s for s, _ in one], [s for s, _ in eight], rtol=0, atol=1e-5)
    assert [g for _, g in one] == [g for _, g in eight]
    assert all(s < 0 for s, _ in one)


def test_loglikelihood_is_the_forward_pass_sum(trained):
    lm = TidalLM(trained, batch_size=8, max_length=64)
    context, continuation = "The jury said", " it did"
    ctx_ids, cont_ids = lm._pair(context, continuation)
    seq = (ctx_ids + cont_ids)[-65:]
    logits = trained.logits(np.asarray([seq[:-1]], np.int32))[0].astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    n = len(cont_ids)
    expected = sum(logp[len(seq) - 1 - n + j, cont_ids[j]] for j in range(n))
    (score, _), = lm.loglikelihood(_requests("loglikelihood", [(context, continuation)]))
    assert abs(score - expected) < 1e-4
    assert lm.encode(context) + cont_ids == lm.encode(context + continuation)


def test_rolling_batch_1_and_8_agree_and_cover_every_token(trained):
    texts = [it["text"] for it in _items("tidal_udhr_eng", 6)]
    reqs = _requests("loglikelihood_rolling", [(t,) for t in texts])
    one = TidalLM(trained, batch_size=1, max_length=32).loglikelihood_rolling(reqs)
    eight = TidalLM(trained, batch_size=8, max_length=32).loglikelihood_rolling(reqs)
    assert np.allclose(one, eight, rtol=0, atol=1e-5)
    lm = TidalLM(trained, batch_size=8, max_length=32)
    short = "All human beings"  # fits in one window: [eos] + ids scored as one sequence
    ids = lm.encode(short)
    (direct, _), = lm.score([([lm.eos_id], ids)])
    assert abs(lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(short,)]))[0] - direct) < 1e-9


def test_greedy_generation_is_deterministic_and_stops_at_until(trained):
    args = [(it["context"], {"until": ["\n"], "max_gen_toks": 6}) for it in _items("tidal_brown_lastword", 9)]
    args.append(("The", {"until": ["e"], "max_gen_toks": 12}))
    one = TidalLM(trained, batch_size=1).generate_until(_requests("generate_until", args))
    eight = TidalLM(trained, batch_size=8).generate_until(_requests("generate_until", args))
    assert one == eight
    assert all("\n" not in text for text in one[:-1]) and "e" not in one[-1]
    assert one == TidalLM(trained, batch_size=4).generate_until(_requests("generate_until", args))
