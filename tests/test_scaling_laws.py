"""The math of scaling laws: the IsoFLOP ladder's candidates by Marin's rules (checked against hand-computed
examples and Levanter's own counts), and the fits — a Huber parabola per budget that a bad run does not
move (where least squares is moved), power laws recovered from noisy synthetic ladders, the prediction at
a next budget, and clear refusals of what determines no law."""

import math

import numpy as np
import pytest

from marin_assets.core.results import encode_result, from_jsonable
from marin_assets.pipeline.reports.scaling_laws import (
    BudgetFit,
    ScalingFitError,
    ScalingLaws,
    ScalingRun,
    fit_budget,
    fit_power_law,
    fit_scaling_laws,
    huber_quadratic,
)
from marin_assets.pipeline.training.cost import training_flops_per_token
from marin_assets.pipeline.training.isoflop import (
    IsoFlopCandidate,
    IsoFlopError,
    IsoFlopScale,
    RejectedCandidate,
    batch_for,
    candidate,
    isoflop_ladder,
    learning_rate_for,
    llama_parameters,
    model_for,
    num_layers_for,
)
from marin_assets.pipeline.training.specs import ModelSpec

VOCAB = 512
CPU = IsoFlopScale()
MARIN = IsoFlopScale(hidden_start=512, hidden_stop=4096, hidden_step=128, head_dim=128, seq_len=4096,
                     reference_steps=2**16, min_batch=8)


def megatron_forward_flops(hidden: int, layers: int, heads: int, seq_len: int, vocab: int) -> int:
    """Forward FLOPs per token of a Llama with MLP 4·h and as many KV heads as heads, by hand: 2 per
    multiply-add of the q, k, v, o and SwiGLU projections, the attention map over the whole context
    (QKᵀ and AV, 2·s·h each per token, plus 3·s·heads for mask and softmax) and the LM head."""
    projections = 2 * 3 * hidden * hidden + 2 * hidden * hidden + 2 * 3 * hidden * (4 * hidden)
    attention = 2 * seq_len * hidden + 3 * seq_len * heads + 2 * seq_len * hidden
    return layers * (projections + attention) + 2 * hidden * vocab


# ---- the ladder's rules ----


def test_depth_heads_and_mlp_follow_marins_rules_at_marins_widths():
    # h / (64 + 4·log2 h − 9): 512/91 = 5.63, 768/93.3 = 8.23, 1024/95 = 10.78, 2048/99 = 20.69, 4096/103 = 39.77
    assert [num_layers_for(h) for h in (512, 768, 1024, 2048, 4096)] == [6, 8, 11, 21, 40]
    assert [num_layers_for(h) for h in (16, 32, 64, 128)] == [1, 1, 1, 2]  # 0.23, 0.43 → at least one; 1.54 → 2
    model = model_for(1024, MARIN)
    assert (model.family, model.hidden_dim, model.intermediate_dim, model.num_layers) == ("llama", 1024, 4096, 11)
    assert (model.num_heads, model.num_kv_heads, model.seq_len, model.max_seq_len) == (8, 8, 4096, 4096)
    assert MARIN.hidden_sizes()[:3] == [512, 640, 768] and MARIN.hidden_sizes()[-1] == 4096
    assert CPU.hidden_sizes() == [16, 32, 48, 64, 80, 96, 112, 128]
    tiny = model_for(48, CPU)
    assert (tiny.num_heads, tiny.intermediate_dim, tiny.max_seq_len) == (3, 192, 2048)  # ModelSpec's default context


def test_parameters_and_flops_per_token_agree_with_levanter_and_by_hand():
    from marin_assets.pipeline.training.levanter_model import model_config

    shapes = [model_for(64, CPU), model_for(1024, MARIN),
              ModelSpec(hidden_dim=96, intermediate_dim=200, num_layers=3, num_heads=6, num_kv_heads=2),
              ModelSpec(hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=4, num_kv_heads=4,
                        tie_embeddings=True)]
    for model in shapes:
        assert llama_parameters(model, VOCAB) == model_config(model, "", "").total_trainable_params(VOCAB), model
    # 2·512·64 embeddings and LM head + one layer (4·64² attention, 3·64·256 MLP, 2·64 norms) + 64 final norm
    assert llama_parameters(model_for(64, CPU), VOCAB) == 65_536 + 16_384 + 49_152 + 128 + 64 == 131_264
    assert training_flops_per_token(model_for(64, CPU), VOCAB) == 3 * megatron_forward_flops(64, 1, 4, 128, VOCAB)
    assert 3 * megatron_forward_flops(64, 1, 4, 128, VOCAB) == 692_736


def test_a_candidate_by_hand():
    # d64: 692,736 training FLOPs per token (above); 1e12 FLOPs → 1,443,552.6 tokens; ÷ (128 steps × 128) = 88.1
    # sequences → a batch of 128; 1,443,552.6 ÷ (128 × 128) = 88.1 → 88 steps = 1,441,792 tokens
    run = candidate(1e12, 64, VOCAB, CPU)
    assert isinstance(run, IsoFlopCandidate)
    assert (run.batch_size, run.num_train_steps, run.tokens, run.parameters) == (128, 88, 1_441_792, 131_264)
    assert run.flops_per_token == 692_736 and run.flops == 692_736 * 1_441_792
    assert abs(run.flops / 1e12 - 1) < 0.01
    assert run.tokens_per_param == pytest.approx(1_441_792 / 131_264)
    assert run.learning_rate == pytest.approx(3e-3 * math.sqrt(128 / 16) * (819_200 / 1_441_792) ** 0.3)
    assert run.label == "1e12-d64-L1-B128"
    assert learning_rate_for(16, 819_200, CPU) == pytest.approx(3e-3)  # the reference point itself
    assert learning_rate_for(64, 819_200, CPU) == pytest.approx(6e-3)  # 4× the batch: 2× the rate
    assert learning_rate_for(16, 819_200 * 10, CPU) == pytest.approx(3e-3 * 10**-0.3)  # 10× the tokens
    assert [batch_for(t, CPU) for t in (1, 128 * 128 * 4, 128 * 128 * 5, 128 * 128 * 100)] == [4, 4, 8, 128]


def test_too_many_tokens_per_parameter_and_whole_steps_off_the_budget_are_rejected():
    # d16 at 1e12: 20,528 parameters (2·512·16 + 4·16² + 3·16·64 + 2·16 + 16) read 1e12 / its FLOPs per token
    per_token = 3 * megatron_forward_flops(16, 1, 1, 128, VOCAB)
    rejected = candidate(1e12, 16, VOCAB, CPU)
    assert isinstance(rejected, RejectedCandidate) and rejected.hidden_dim == 16
    assert rejected.tokens == pytest.approx(1e12 / per_token)
    assert f"{1e12 / per_token / 20_528:.0f} tokens per parameter" in rejected.reason
    assert "over max_tokens_per_param 250" in rejected.reason and 1e12 / per_token / 20_528 > 250
    assert isinstance(candidate(1e12, 16, VOCAB, IsoFlopScale(max_tokens_per_param=500)), IsoFlopCandidate)
    # d96 at 1e10: 1e10 / its FLOPs per token fill 15.3 batches of 4 × 128: 15 whole steps spend 2.5 % more
    per_token = 3 * megatron_forward_flops(96, 1, 6, 128, VOCAB)
    assert round(1e10 / per_token / 512) == 15 and abs(15 * 512 * per_token / 1e10 - 1) > 0.02
    off = candidate(1e10, 96, VOCAB, CPU)
    assert isinstance(off, RejectedCandidate)
    assert "15 whole steps of 4 × 128 tokens" in off.reason and "off the budget (flop_tolerance 1.0%)" in off.reason
    assert isinstance(candidate(1e10, 96, VOCAB, IsoFlopScale(flop_tolerance=0.05)), IsoFlopCandidate)


def test_a_cpu_ladder_keeps_what_the_rules_allow_per_budget():
    ladder = isoflop_ladder([1e12, 1e11, 3e11], VOCAB)
    assert ladder.budgets == (1e11, 3e11, 1e12)
    assert len(ladder.candidates) + len(ladder.rejected) == 3 * len(CPU.hidden_sizes())
    assert [(r.budget, r.hidden_dim) for r in ladder.rejected] == [(1e12, 16)]
    for budget in ladder.budgets:
        runs = ladder.for_budget(budget)
        assert len(runs) >= 3
        assert [r.model.hidden_dim for r in runs] == sorted(r.model.hidden_dim for r in runs)
        assert [r.tokens for r in runs] == sorted((r.tokens for r in runs), reverse=True)  # wider: fewer tokens
        for run in runs:
            assert abs(run.flops / budget - 1) <= CPU.flop_tolerance and run.tokens_per_param <= 250
            assert run.tokens == run.num_train_steps * run.batch_size * CPU.seq_len
            assert run.batch_size >= CPU.min_batch and run.batch_size & (run.batch_size - 1) == 0
            assert run.flops_per_token == training_flops_per_token(run.model, VOCAB)
    # the compute-optimal size (about 20 tokens per parameter) lies inside every budget's widths
    for budget in ladder.budgets:
        ratios = [r.tokens_per_param for r in ladder.for_budget(budget)]
        assert max(ratios) > 20 > min(ratios)
    assert encode_result("ladder", ladder) is not None  # a plain record


def test_bad_ladders_are_refused_clearly():
    with pytest.raises(IsoFlopError, match="at least one FLOP budget"):
        isoflop_ladder([], VOCAB)
    with pytest.raises(IsoFlopError, match="positive and finite"):
        isoflop_ladder([1e11, -1.0], VOCAB)
    with pytest.raises(IsoFlopError, match="must differ"):
        isoflop_ladder([1e11, 1e11], VOCAB)
    with pytest.raises(IsoFlopError, match="print alike"):
        isoflop_ladder([1e11, 1.0000001e11], VOCAB)
    with pytest.raises(IsoFlopError, match=r"budget 1e\+08 keeps [0-2] of 8 widths .*needs 3: d"):
        isoflop_ladder([1e11, 1e8], VOCAB)
    with pytest.raises(IsoFlopError, match="multiples of head_dim 16"):
        IsoFlopScale(hidden_step=24)
    with pytest.raises(IsoFlopError, match="hidden_stop 8 is below hidden_start 16"):
        IsoFlopScale(hidden_stop=8)
    with pytest.raises(IsoFlopError, match="not one of this ladder's"):
        isoflop_ladder([1e11], VOCAB).for_budget(3e11)


# ---- the fits ----


def planted_parabola(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nine runs with a minimum at log10(tokens) = 6.2, noise of 0.002, and two bad runs (one diverged
    high at few tokens, one low at many) — the clean curve returned beside the observed one."""
    x = np.linspace(5.0, 7.0, 9)
    clean = 0.3 * (x - 6.2) ** 2 + 3.0
    observed = clean + rng.normal(0, 0.002, x.size)
    observed[1] += 0.4
    observed[7] -= 0.3
    return x, clean, observed


def test_the_huber_fit_recovers_a_planted_minimum_that_least_squares_misses():
    x, _, y = planted_parabola(np.random.default_rng(0))
    robust = huber_quadratic(x, y)
    assert -robust.b / (2 * robust.a) == pytest.approx(6.2, abs=0.02)
    assert robust.a == pytest.approx(0.3, rel=0.05)
    assert robust.weights[1] < 0.05 and robust.weights[7] < 0.05  # the two bad runs set aside
    assert min(w for i, w in enumerate(robust.weights) if i not in (1, 7)) > 0.5
    a, b, _ = np.polyfit(x, y, 2)
    assert abs(-b / (2 * a) - 6.2) > 0.15  # least squares is dragged off by the two bad runs
    # Marin's fixed threshold of 1.0 metric units is least squares on a metric near 3
    marin = huber_quadratic(x, y, delta=1.0)
    assert -marin.b / (2 * marin.a) == pytest.approx(-b / (2 * a), rel=1e-9)
    # without bad runs and noise, the fit is the parabola
    exact = huber_quadratic(x, 0.3 * (x - 6.2) ** 2 + 3.0)
    assert (exact.a, exact.b, exact.c) == pytest.approx((0.3, -0.3 * 2 * 6.2, 0.3 * 6.2**2 + 3.0), rel=1e-9)


def test_a_budget_fit_gives_the_optimum_and_interpolates_parameters():
    x, _, y = planted_parabola(np.random.default_rng(1))
    budget = 1e18
    runs = [ScalingRun(f"r{i}", budget, 10**xi, budget / (6 * 10**xi), yi)
            for i, (xi, yi) in enumerate(zip(x, y, strict=True))]
    fit = fit_budget(budget, list(reversed(runs)))
    assert [r.name for r in fit.runs] == [f"r{i}" for i in range(9)]  # fewest tokens first
    assert fit.optimal_tokens == pytest.approx(10**6.2, rel=0.05)
    # N·D = C/6 on every run is a line in log–log: the interpolation is exact
    assert fit.optimal_parameters == pytest.approx(budget / (6 * fit.optimal_tokens), rel=1e-9)
    assert fit.optimal_metric == pytest.approx(3.0, abs=0.003)
    assert fit.metric_at(fit.optimal_tokens) == pytest.approx(fit.optimal_metric)
    assert fit.weights[1] < 0.05 and fit.weights[7] < 0.05


def test_fits_that_determine_no_optimum_are_refused_naming_the_budget():
    def runs(budget: float, xs, ys):
        return [ScalingRun(f"r{i}", budget, 10**xi, 1e5, yi) for i, (xi, yi) in enumerate(zip(xs, ys, strict=True))]

    x = np.linspace(5.0, 7.0, 5)
    with pytest.raises(ScalingFitError, match=r"budget 3e\+17: the fitted parabola opens downward .*no minimum"):
        fit_budget(3e17, runs(3e17, x, 3.0 - (x - 6.0) ** 2))
    with pytest.raises(ScalingFitError, match=r"budget 1e\+18: the fitted minimum at 1\.58e\+07 tokens lies"
                                              r" outside the tokens sampled \(1e\+05–1e\+07\).*add smaller models"):
        fit_budget(1e18, runs(1e18, x, 0.2 * (x - 7.2) ** 2 + 3.0))
    with pytest.raises(ScalingFitError, match=r"minimum at 1e\+04 tokens.*fewer tokens: add larger models"):
        fit_budget(1e18, runs(1e18, x, 0.2 * (x - 4.0) ** 2 + 3.0))
    with pytest.raises(ScalingFitError, match=r"budget 1e\+18: 2 runs at 2 distinct token counts; .*at least 3"):
        fit_budget(1e18, runs(1e18, [5.0, 6.0], [3.1, 3.0]))
    with pytest.raises(ScalingFitError, match=r"budget 1e\+18: 3 runs at 2 distinct token counts"):
        fit_budget(1e18, runs(1e18, [5.0, 6.0, 6.0], [3.1, 3.0, 3.01]))
    with pytest.raises(ScalingFitError, match=r"run 'r2': its metric is nan \(did it diverge\?\)"):
        fit_budget(1e18, runs(1e18, x, [3.1, 3.0, math.nan, 3.0, 3.1]))
    with pytest.raises(ScalingFitError, match="run 'r0': tokens must be positive"):
        fit_budget(1e18, [ScalingRun("r0", 1e18, 0.0, 1e5, 3.0)] + runs(1e18, x[1:], [3.0, 2.9, 3.0, 3.1]))
    with pytest.raises(ScalingFitError, match=r"budget 1e\+18: runs \['r0'\] spent another budget"):
        fit_budget(1e18, runs(1e17, x[:1], [3.0]) + runs(1e18, x[1:], [3.0, 2.9, 3.0, 3.1])[1:])
    with pytest.raises(ScalingFitError, match="threshold must be positive"):
        huber_quadratic(x, x**2, delta=0.0)
    px, _, py = planted_parabola(np.random.default_rng(0))
    with pytest.raises(ScalingFitError, match="did not converge in 2 iterations"):
        huber_quadratic(px, py, max_iterations=2)


def synthetic_ladder(rng: np.random.Generator, budgets, alpha: float, coefficient: float, gamma: float,
                     scale: float, noise: float) -> list[ScalingRun]:
    """Runs whose optimum is planted: D*(C) = coefficient·C^alpha, minimum metric scale·C^gamma, seven runs
    per budget spanning ±0.6 decades of tokens around D*, N = C / (6·D), and metric noise."""
    runs = []
    for budget in budgets:
        best = math.log10(coefficient * budget**alpha)
        for i, x in enumerate(best + np.linspace(-0.6, 0.6, 7) + rng.uniform(-0.05, 0.05, 7)):
            metric = scale * budget**gamma + 0.25 * (x - best) ** 2 + rng.normal(0, noise)
            runs.append(ScalingRun(f"{budget:g}-{i}", budget, 10**x, budget / (6 * 10**x), metric))
    return runs


def test_power_laws_are_recovered_from_a_noisy_synthetic_ladder_and_predict_the_next_budget():
    budgets = [1e17, 3e17, 1e18, 3e18, 1e19]
    runs = synthetic_ladder(np.random.default_rng(7), budgets, alpha=0.52, coefficient=0.25, gamma=-0.048,
                            scale=22.0, noise=0.003)
    runs[3] = ScalingRun(runs[3].name, runs[3].budget, runs[3].tokens, runs[3].parameters, runs[3].metric + 0.5)
    laws = fit_scaling_laws(runs, "eval/loss", next_budget=1e20)
    assert [f.budget for f in laws.fits] == budgets
    assert laws.tokens_law.exponent == pytest.approx(0.52, abs=0.02)
    assert laws.parameters_law.exponent == pytest.approx(0.48, abs=0.02)  # N = C/(6D): β = 1 − α
    assert laws.tokens_law.exponent + laws.parameters_law.exponent == pytest.approx(1.0, abs=1e-9)
    assert laws.metric_law.exponent == pytest.approx(-0.048, abs=0.003)
    prediction = laws.prediction
    assert prediction is not None and prediction.budget == 1e20
    truth = 22.0 * 1e20**-0.048
    assert prediction.metric == pytest.approx(truth, rel=0.005)
    assert prediction.tokens == pytest.approx(0.25 * 1e20**0.52, rel=0.1)
    assert prediction.tokens * prediction.parameters * 6 == pytest.approx(1e20, rel=1e-6)
    assert laws.predict(1e20) == prediction and laws.predict(1e18).metric == pytest.approx(laws.metric_law.at(1e18))
    assert laws.fits[0].weights[3] < 0.1  # the planted bad run
    assert fit_scaling_laws(runs, "eval/loss").prediction is None
    # least squares (a threshold no residual reaches) bends the smallest budget's parabola over that bad run
    with pytest.raises(ScalingFitError, match=r"budget 1e\+17: the fitted parabola opens downward"):
        fit_scaling_laws(runs, "eval/loss", next_budget=1e20, delta=100.0)
    assert fit_scaling_laws(runs[7:], "eval/loss", delta=100.0).tokens_law.exponent == pytest.approx(0.52, abs=0.02)


def test_a_ladder_of_real_candidates_recovers_a_planted_law():
    """The candidates of a real CPU ladder (the project's FLOPs per token, parameters as Levanter counts
    them) with a planted metric: the fit finds D* = C^0.5 and an N* between the candidates around it."""
    ladder = isoflop_ladder([1e11, 3e11, 1e12], VOCAB)
    rng = np.random.default_rng(3)
    runs = []
    for c in ladder.candidates:
        best = 0.5 * math.log10(c.budget)  # 1e11: 3.2e5 … 1e12: 1e6 tokens, inside each budget's range
        metric = 5.0 * c.budget**-0.05 + 0.3 * (math.log10(c.tokens) - best) ** 2 + rng.normal(0, 0.002)
        runs.append(ScalingRun(c.label, c.budget, c.tokens, c.parameters, metric))
    laws = fit_scaling_laws(runs, "eval/bpb", next_budget=3e12)
    assert laws.tokens_law.exponent == pytest.approx(0.5, abs=0.03)
    assert laws.metric_law.exponent == pytest.approx(-0.05, abs=0.005)
    for fit in laws.fits:
        around = sorted(ladder.for_budget(fit.budget), key=lambda c: c.tokens)
        fewer = [c for c in around if c.tokens <= fit.optimal_tokens][-1]  # a larger model
        more = [c for c in around if c.tokens >= fit.optimal_tokens][0]  # a smaller one
        assert more.parameters <= fit.optimal_parameters <= fewer.parameters
    assert laws.prediction is not None
    assert laws.prediction.metric == pytest.approx(5.0 * 3e12**-0.05, rel=0.005)


def test_laws_need_two_budgets_and_positive_values():
    runs = synthetic_ladder(np.random.default_rng(0), [1e18], 0.5, 0.3, -0.05, 20.0, 0.001)
    with pytest.raises(ScalingFitError, match=r"at least two budgets, got 1e\+18 only"):
        fit_scaling_laws(runs, "eval/loss")
    with pytest.raises(ScalingFitError, match="no runs to fit"):
        fit_scaling_laws([], "eval/loss")
    with pytest.raises(ScalingFitError, match=r"runs \['1e\+18-0'\] appear more than once"):
        fit_scaling_laws(runs + runs[:1], "eval/loss")
    with pytest.raises(ScalingFitError, match="power law of the minimum eval/loss needs positive values"):
        fit_power_law([1e18, 1e19], [0.5, -0.1], "the minimum eval/loss")
    with pytest.raises(ScalingFitError, match="needs at least two budgets"):
        fit_power_law([1e18, 1e18], [0.5, 0.4])
    two = synthetic_ladder(np.random.default_rng(0), [1e18, 1e19], 0.5, 0.3, -0.05, 20.0, 0.001)
    with pytest.raises(ScalingFitError, match="positive and finite, got -1"):
        fit_scaling_laws(two, "eval/loss", next_budget=-1.0)
    assert fit_scaling_laws(two, "eval/loss").tokens_law.log10_rms == pytest.approx(0.0, abs=1e-12)


def test_the_laws_are_a_recordable_result():
    runs = synthetic_ladder(np.random.default_rng(2), [1e17, 1e18, 1e19], 0.5, 0.3, -0.05, 20.0, 0.002)
    laws = fit_scaling_laws(runs, "eval/loss", next_budget=1e20)
    data = encode_result("analysis/scaling", laws)
    assert from_jsonable(data, ScalingLaws) == laws
    assert isinstance(from_jsonable(data, ScalingLaws).fits[0], BudgetFit)
