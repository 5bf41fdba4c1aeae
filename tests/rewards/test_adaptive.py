"""Adaptive thresholds: squashing, bounded drift toward the buffer percentile, state."""

from __future__ import annotations

import math

import pytest

from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds, squash


def test_squash_hand_values():
    assert squash(0.8, 0.6, 4.0, 2.0) == pytest.approx(0.5 + 0.5 * (1 - math.exp(-4.0 * 0.2)))
    assert squash(0.4, 0.6, 4.0, 2.0) == pytest.approx(0.5 * math.exp(2.0 * -0.2))
    assert squash(0.6, 0.6, 4.0, 2.0) == 0.5
    assert 0.0 < squash(-1.0, 0.95, 5, 5) < squash(0.0, 0.95, 5, 5) < 0.5 < squash(1.0, 0.0, 5, 5) < 1.0


def test_threshold_moves_at_most_delta_toward_percentile():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.02, percentile=50, init={"bertscore": 0.3, "cosine": 0.9}))
    t.observe({"bertscore": [0.8] * 10, "cosine": [0.1] * 10})
    assert t.current() == {"bertscore": 0.3, "cosine": 0.9}        # scoring does not move them
    assert t.end_batch() == pytest.approx({"bertscore": 0.32, "cosine": 0.88})
    for _ in range(100):
        t.observe({"bertscore": [0.8], "cosine": [0.1]})
        t.end_batch()
    assert t.thresholds["bertscore"] == pytest.approx(0.8)         # converges, never overshoots
    assert t.thresholds["cosine"] == pytest.approx(0.1)


def test_small_move_lands_exactly_on_target():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.5, init={"cosine": 0.5}), metrics=["cosine"])
    t.observe({"cosine": [0.1, 0.2, 0.9]})
    t.end_batch()
    assert t.thresholds["cosine"] == pytest.approx(0.2)            # the median


def test_clip_to_t_min_t_max():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=1.0, t_max=0.95), metrics=["cosine"])
    t.observe({"cosine": [1.0, 1.0]})
    t.end_batch()
    assert t.thresholds["cosine"] == 0.95
    t.observe({"cosine": [-1.0] * 5})
    t.end_batch()
    assert t.thresholds["cosine"] == 0.0


def test_buffer_is_bounded_and_percentile_configurable():
    t = AdaptiveThresholds(AdaptiveConfig(buffer_size=4, delta_max=1.0, percentile=100), metrics=["cosine"])
    t.observe({"cosine": [0.9, 0.1, 0.1, 0.1, 0.2]})
    t.end_batch()
    assert list(t.buffers["cosine"]) == [0.1, 0.1, 0.1, 0.2]       # 0.9 fell out
    assert t.thresholds["cosine"] == pytest.approx(0.2)


def test_empty_and_nonfinite_values_do_not_move():
    t = AdaptiveThresholds()
    before = t.current()
    t.observe({"cosine": [], "bertscore": [float("nan")]})
    t.end_batch()
    assert t.current() == before and t.updates == 0


def test_state_dict_round_trip_and_unknown_metric():
    t = AdaptiveThresholds()
    t.observe({"cosine": [0.7, 0.8], "bertscore": [0.2]})
    t.end_batch()
    u = AdaptiveThresholds()
    u.load_state_dict(t.state_dict())
    assert u.state_dict() == t.state_dict()
    with pytest.raises(ValueError, match="expected metrics among"):
        t.observe({"bleu": [0.1]})
    t.end_batch()
    with pytest.raises(ValueError, match="expected a state"):
        u.load_state_dict({"nope": 1})


@pytest.mark.parametrize("kwargs", [{"buffer_size": 0}, {"percentile": 101}, {"delta_max": -0.1},
                                    {"t_min": 0.9, "t_max": 0.1}, {"alpha_pos": 0}])
def test_bad_config(kwargs):
    with pytest.raises(ValueError, match="expected"):
        AdaptiveConfig(**kwargs)


def test_scoring_never_moves_thresholds_only_the_batch_end_does():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
    for _ in range(60):                                             # a notebook probing one answer
        t.observe({"cosine": [0.9]})
        assert t.current() == {"cosine": 0.5}
    assert t.end_batch() == {"cosine": 0.55}                        # one move for the whole batch
    assert t.updates == 1 and not t.pending["cosine"]


def test_end_batch_is_idempotent_per_batch_id_and_pending_survives_state():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
    t.observe({"cosine": [0.9, 0.9]})
    u = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
    u.load_state_dict(t.state_dict())                              # a checkpoint taken mid-batch
    assert list(u.pending["cosine"]) == [0.9, 0.9]
    for store in (t, u):
        assert store.end_batch(batch_id=7) == {"cosine": 0.55}
        store.observe({"cosine": [0.9]})
        assert store.end_batch(batch_id=7) == {"cosine": 0.55}     # a second worker announcing step 7
        assert store.end_batch(batch_id=8) == pytest.approx({"cosine": 0.6})
    assert u.state_dict() == t.state_dict()


def test_a_stale_batch_id_moves_nothing_and_keeps_the_scores_for_the_next_batch():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
    t.observe({"cosine": [0.9]})
    assert t.end_batch(5) == {"cosine": 0.55}
    t.observe({"cosine": [0.9, 0.9]})
    for late in (3, 4, 5, 3):                                      # older steps and a repeat, in any order
        assert t.end_batch(late) == {"cosine": 0.55}
        assert t.updates == 1 and t.last_batch_id == 5            # a late id does not rewind the clock
        assert list(t.pending["cosine"]) == [0.9, 0.9] and len(t.buffers["cosine"]) == 1
    assert t.end_batch() == pytest.approx({"cosine": 0.6})         # no id: always a boundary ...
    t.observe({"cosine": [0.9]})
    assert t.end_batch(4) == pytest.approx({"cosine": 0.6})        # ... that does not forget step 5
    assert t.end_batch(6) == pytest.approx({"cosine": 0.65}) and t.last_batch_id == 6 and t.updates == 3


def test_batch_ids_that_do_not_order_are_refused():
    t = AdaptiveThresholds(metrics=["cosine"])
    t.end_batch(1)
    with pytest.raises(ValueError, match="expected batch ids that order like the previous one"):
        t.end_batch("step-2")


@pytest.mark.parametrize("kwargs", [{"buffer_size": 1}, {"percentile": 0.0}, {"percentile": 0.5}, {"delta_max": 0.0},
                                    {"t_min": 0.4, "t_max": 0.4}, {"alpha_pos": 0.5, "alpha_neg": 0.5}])
def test_config_edges_that_are_valid(kwargs):
    AdaptiveConfig(**kwargs)  # the bounds are inclusive where the docs say so; no error


def test_a_metric_missing_from_init_starts_at_one_half():
    assert AdaptiveThresholds(AdaptiveConfig(init={}), metrics=["cosine"]).current() == {"cosine": 0.5}


def test_buffers_and_pending_stay_bounded_across_batches():
    t = AdaptiveThresholds(AdaptiveConfig(buffer_size=4), metrics=["cosine"])
    for _ in range(3):
        t.observe({"cosine": [0.1] * 10})
        assert len(t.pending["cosine"]) == 4
        t.end_batch()
        assert len(t.buffers["cosine"]) == 4


def test_a_metric_without_scores_does_not_stop_the_others_moving():
    t = AdaptiveThresholds(AdaptiveConfig(delta_max=0.05, init={"bertscore": 0.5, "cosine": 0.5}))
    t.observe({"cosine": [0.9]})                                   # bertscore (first) has nothing pending
    assert t.end_batch() == {"bertscore": 0.5, "cosine": 0.55}


def test_load_state_dict_bounds_what_it_loads_and_keeps_the_last_batch_id():
    t = AdaptiveThresholds(AdaptiveConfig(buffer_size=4, delta_max=0.05, init={"cosine": 0.5}), metrics=["cosine"])
    t.load_state_dict({"thresholds": {"cosine": 0.6}, "buffers": {"cosine": [0.9] * 10},
                       "pending": {"cosine": [0.9] * 10}, "last_batch_id": 7})
    assert len(t.buffers["cosine"]) == 4 and len(t.pending["cosine"]) == 4 and t.updates == 0
    assert t.end_batch(7) == {"cosine": 0.6}                       # step 7 already ended before the checkpoint
    t.load_state_dict({"thresholds": {"cosine": 0.6}, "buffers": {"cosine": []}})
    assert list(t.pending["cosine"]) == [] and t.last_batch_id is None and t.updates == 0


def test_state_dict_names_its_store_config_and_last_batch_id():
    t = AdaptiveThresholds(AdaptiveConfig(init={"cosine": 0.3}), metrics=["cosine"])
    t.end_batch(3)
    state = t.state_dict()
    assert state["store"] == "local" and state["last_batch_id"] == 3 and state["config"]["init"] == {"cosine": 0.3}
    assert set(state) == {"store", "config", "thresholds", "buffers", "pending", "updates", "last_batch_id"}
