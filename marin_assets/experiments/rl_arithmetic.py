"""RL from verifiable rewards on digit arithmetic: the demo's pretrained Llama, fine-tuned on worked examples, then
trained by RL to continue arithmetic runs of digits — and cached like every other step.

The pretraining is the demo's own (`experiments/python_docs.py`), reused step for step. The environment is
`SequentialDigits` counting by one or by two modulo 10 (`3 5 7 9` → `1 3 5`): the model must read the step from
the prompt and add it, digit after digit. Its problems are split by a seeded hash, a quarter held out. SFT sees a
few hundred worked examples of the training problems (the answer alone, as an assistant turn); RL starts from the SFT
model and samples completions of the same training problems, rewarded per correct digit in place (RLOO advantages,
a clipped policy gradient, the KL to the SFT model measured). The held-out pass rate — greedy completions of
problems neither SFT nor RL saw, exactly right — is measured at the start (the SFT model's) and every ten steps.
The RL model is exported and evaluated (held-out worked-example loss) like any model, beside the SFT model's
evaluation on the same split.
"""

from __future__ import annotations

import dataclasses

from marin_assets import Experiment, Step
from marin_assets.experiments import python_docs
from marin_assets.steps import (
    SFT_OPTIMIZER,
    OptimizerSpec,
    RlSpec,
    SequentialDigits,
    TrainerSpec,
    chat_tokenize_step,
    export_step,
    from_checkpoint,
    from_hf,
    loss_eval_step,
    rl_step,
    sft_step,
    worked_examples_step,
)

ENV = SequentialDigits(length=3, min_prompt=2, max_prompt=8, steps=(1, 2))
"""107 training and 33 held-out runs of digits counting by one or by two modulo 10; three digits to continue with."""
WORKED_EXAMPLES = 107
SFT_TRAINER = TrainerSpec(num_train_steps=30, train_batch_size=16, checkpoint_every=50, steps_per_eval=50,
                          max_eval_batches=4)
"""480 worked examples seen: about four passes over the training problems."""
RL = RlSpec(prompts_per_step=16, samples_per_prompt=8, max_new_tokens=8, held_out_problems=64, eval_every=10,
            samples_logged=8)
RL_OPTIMIZER = OptimizerSpec(learning_rate=5e-4, weight_decay=0.0, warmup=0.1, lr_schedule="constant",
                             min_lr_ratio=1.0)
RL_TRAINER = TrainerSpec(num_train_steps=120, checkpoint_every=40)


def build(prefix: str = "rl-digits") -> dict[str, Step]:
    """The demo's pretraining, then `raw/{prefix}-examples` … `evals/{prefix}-rl`."""
    pretrained = python_docs.pipeline
    model = dataclasses.replace(python_docs.MODEL, seq_len=128)
    examples = worked_examples_step(f"raw/{prefix}-examples", ENV, train=WORKED_EXAMPLES, validation=33)
    chat = chat_tokenize_step(f"tokenized/{prefix}-examples", examples, pretrained["tokenizer"])
    sft = sft_step(f"checkpoints/{prefix}-sft", {"chat": chat}, from_hf(pretrained["export"]), model,
                   SFT_OPTIMIZER, SFT_TRAINER)
    rl = rl_step(f"checkpoints/{prefix}-rl", from_checkpoint(sft), ENV, RL, optimizer=RL_OPTIMIZER,
                 trainer=RL_TRAINER)
    return {**pretrained, "examples": examples, "chat": chat, "sft": sft, "rl": rl,
            "rl_export": export_step(f"exports/{prefix}-rl", rl),
            "rl_evaluate": loss_eval_step(f"evals/{prefix}-rl", rl, {"examples": chat}),
            "sft_evaluate": loss_eval_step(f"evals/{prefix}-sft", sft, {"examples": chat})}


pipeline = build()
steps = [pipeline["rl_export"], pipeline["rl_evaluate"], pipeline["sft_evaluate"]]
experiment = Experiment("rl-digits", steps)


def main() -> None:
    """`python -m marin_assets.experiments.rl_arithmetic`: materialize the experiment under the storage prefix, in
    this process (cached steps are reused), and print the held-out pass rate before and after RL."""
    from marin_assets.core.materialize import materialize_step
    from marin_assets.core.record import load_result
    from marin_assets.core.step import walk
    from marin_assets.steps import RlMetrics, TrainResult

    for step in walk(steps):
        outcome = materialize_step(step)
        print(f"{step.name}: {'cached' if outcome.cached else 'materialized'} at {outcome.output_path}")
    rl = load_result(pipeline["rl"], TrainResult).method_metrics
    assert isinstance(rl, RlMetrics), f"{pipeline['rl'].name} recorded no RL metrics"
    print(f"held-out pass rate: {rl.initial_held_out_pass_rate:.3f} (SFT) → {rl.final_held_out_pass_rate:.3f} (RL),"
          f" {rl.held_out_problems} problems; sampling {rl.sampling_tokens_per_second} tokens/s,"
          f" updates {rl.update_tokens_per_second} tokens/s")
    for key in ("sft_evaluate", "rl_evaluate"):
        result = materialize_step(pipeline[key]).record.result
        print(f"{pipeline[key].name}: held-out worked-example loss {result['loss']:.3f}")


if __name__ == "__main__":
    main()
