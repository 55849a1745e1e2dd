"""The report's eval lines: each eval set's loss at step 0 (before any update) -> the last step."""

from __future__ import annotations

from tidal.core.report import eval_curves, format_report

SUMMARY = {"steps": 400, "eval_loss": 5.42, "eval_loss/udhr": 6.6686, "initial_eval_loss/udhr": 8.3397,
           "eval_loss/heldout/brown": 5.3353, "initial_eval_loss/heldout/brown": 8.3495,
           "eval_bpb/udhr": 5.5, "eval_loss/old": 7.0}


def test_eval_curves_pair_first_and_last_in_distribution_first():
    assert eval_curves(SUMMARY) == {"heldout/brown": [8.3495, 5.3353], "old": [None, 7.0], "udhr": [8.3397, 6.6686]}


def test_report_prints_first_to_last_for_each_eval():
    report = {"recipe": "tiny", "run_key": "k", "steps_run": ["train"], "steps_skipped": [], "gate": "passed",
              "tokens_seen": 812800, "steps": 400, "final_train_loss": 5.2239, "eval_loss": 5.42,
              "evals": eval_curves(SUMMARY), "checkpoints": "/x/checkpoints", "mlflow_uri": "sqlite:///m.db",
              "missing": []}
    lines = format_report(report).splitlines()
    assert "  eval loss:     nats/token, step 0 -> 400 (mean 5.4200)" in lines
    assert ("    heldout/brown  8.3495 -> 5.3353  (in distribution: held-out documents of a training source)"
            in lines)
    assert "    udhr           8.3397 -> 6.6686  (out of distribution: a source kept out of the mixture)" in lines
    assert "    old            None -> 7.0000  (out of distribution: a source kept out of the mixture)" in lines
    without = format_report({**report, "evals": {}}).splitlines()
    assert "  eval loss:     5.4200 (held out)" in without


def test_report_prints_one_line_per_downstream_task():
    from tidal.core.report import downstream

    results = {"tasks": {"tidal_udhr_eng": {"metrics": {"bits_per_byte": 2.28793008, "word_perplexity": 14533.68},
                                            "n_examples": 92, "n_shot": 0},
                         "tidal_brown_cloze": {"metrics": {"acc": 0.375}, "n_examples": 56, "n_shot": 0}}}
    report = {"recipe": "tiny", "run_key": "k", "steps_run": ["eval"], "steps_skipped": [], "gate": "passed",
              "downstream": downstream(results), "mlflow_uri": "sqlite:///m.db", "missing": []}
    lines = format_report(report).splitlines()
    at = lines.index("  downstream:    lm-evaluation-harness on the final checkpoint (zero-shot; chance levels and "
                     "notes: tidal/eval/chance.py)")
    # each metric beside its chance level (tidal_brown_cloze: 4 choices per example), then one note per metric
    assert lines[at + 1:at + 3] == [
        "    tidal_brown_cloze  acc 0.375 (chance 0.25)  (n=56)",
        "    tidal_udhr_eng     bits_per_byte 2.28793 (chance 8)  word_perplexity 14533.7  (n=92)"]
    assert lines[at + 3].startswith("    acc (tidal_brown_cloze): picks the likeliest of the choices")
    assert lines[at + 4].startswith("    bits_per_byte (tidal_udhr_eng): lower is better; 8 is a uniform guess")
    assert lines[at + 5].startswith("    word_perplexity (tidal_udhr_eng): 2 ** (bits per byte x bytes per word)")


def test_report_prints_the_launchs_sizing_beside_the_measured_step_time():
    """Issue 40, item 7: a GKE train step's record keeps what the launch sized it as (tidal/train/preflight.py)."""
    base = {"recipe": "tiny", "run_key": "k", "steps_run": ["train"], "steps_skipped": [], "gate": "passed",
            "tokens_seen": 8128, "steps": 4, "final_train_loss": 7.1, "evals": {}, "checkpoints": "/x/checkpoints",
            "mlflow_uri": "sqlite:///m.db", "missing": []}
    sizing = {"method": "compiled", "where": "v5e 2x2 (4 chips, 1 host)", "mesh": {"data": 1, "fsdp": 4, "tensor": 1},
              "chips": 4, "hbm_per_chip_bytes": 3 * 2**29, "hbm_capacity_bytes": 16 * 2**30,
              "predicted_step_s": 0.0123, "predicted_mfu": 0.412, "predicted_tokens_per_s": 1e6,
              "measured": {"step_time_s": 0.0150, "mfu": 0.337, "tokens_per_second": 8e5}}
    lines = format_report({**base, "sizing": sizing}).splitlines()
    at = lines.index("  sizing:        v5e 2x2 (4 chips, 1 host), mesh data=1 fsdp=4 tensor=1, 1.50 of 16.00 GiB HBM "
                     "per chip (compiled)")
    assert lines[at + 1] == "  step time:     predicted 12.3 ms, MFU 41.2%; measured 15.0 ms per step, MFU 33.7%"
    analytical = {k: v for k, v in sizing.items() if not k.startswith("predicted")} | {
        "method": "analytical", "measured": {"step_time_s": None, "mfu": None, "tokens_per_second": None}}
    lines = format_report({**base, "sizing": analytical}).splitlines()
    assert ("  step time:     not predicted (a record written before sizings predicted one); no step time measured"
            in lines)
    assert not any(line.startswith("  sizing:") for line in format_report(base).splitlines())  # not sized: no lines
