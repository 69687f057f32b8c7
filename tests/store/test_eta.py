"""ETA arithmetic from worker measurements."""
from common.eta import WorkerLoad, estimate, fleet_loads, retry_after

BUSY = WorkerLoad(capacity=4, running=4, tokens_per_s=80.0, mean_job_tokens=40.0)  # drains 2 jobs/s
IDLE = WorkerLoad(capacity=4, running=1, tokens_per_s=80.0, mean_job_tokens=40.0)


def test_free_slot_means_start_now():
    eta = estimate(ahead=2, max_tokens=40, workers=[IDLE])
    assert eta.start_in_s < 0.1
    assert eta.finish_in_s == eta.start_in_s + 40 / 20.0  # 80 tok/s shared by 4 slots


def test_queue_wait_grows_with_position_and_shrinks_with_workers():
    # 4 slots, 20 tok/s each; the held jobs have 10, 20, 30, 40 tokens left; a job takes 40
    busy = WorkerLoad(capacity=4, running=4, tokens_per_s=80.0, mean_job_tokens=40.0,
                      remaining_tokens=(10, 20, 30, 40))
    one = [estimate(ahead=n, max_tokens=40, workers=[busy]).start_in_s for n in range(6)]
    assert one == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    two = estimate(ahead=3, max_tokens=40, workers=[busy, busy]).start_in_s
    assert two == 1.0


def test_a_burst_that_fills_every_slot_is_followed_by_one_that_starts_together():
    """16 jobs just started together: the next 16 all start when they end, not one by one."""
    burst = WorkerLoad(capacity=16, running=16, tokens_per_s=160.0, mean_job_tokens=64.0,
                       sequence_tokens_per_s=10.0, remaining_tokens=(64,) * 16)
    starts = [estimate(ahead=n, max_tokens=64, workers=[burst]).start_in_s for n in range(20)]
    assert starts[:16] == [6.4] * 16 and starts[16:] == [12.8] * 4
    assert estimate(ahead=0, max_tokens=64, workers=[burst]).finish_in_s == 12.8


def test_held_jobs_progress_sets_when_slots_free():
    """A worker's held jobs come from Redis with their progress: expected tokens left."""
    info = {"max_batch_size": 2, "running": 2, "tokens_per_s": 20.0, "mean_job_tokens": 50.0,
            "sequence_tokens_per_s": 10.0,
            "held_jobs": [{"completion_tokens": 40, "max_tokens": 100}, {"completion_tokens": 5, "max_tokens": 10}]}
    load = WorkerLoad.from_heartbeat(info)
    assert load.remaining_tokens == (10.0, 5.0)
    assert estimate(ahead=0, max_tokens=50, workers=[load]).start_in_s == 0.5


def test_short_jobs_finish_sooner():
    assert estimate(0, 10, [IDLE]).finish_in_s < estimate(0, 40, [IDLE]).finish_in_s


def test_no_workers_no_eta_and_retry_after_is_computed():
    assert estimate(0, 10, []) is None
    assert retry_after(excess=9, workers=[BUSY]) == 5
    assert retry_after(excess=0, workers=[BUSY]) == 1
    assert retry_after(excess=10_000, workers=[BUSY]) == 600


def test_load_meter_skips_idle_intervals_and_decays():
    from worker.load_meter import LoadMeter

    meter = LoadMeter(rate_alpha=0.5)
    meter.observe(0, busy=False, now=0.0)
    meter.observe(100, busy=True, now=1.0)  # 100 tok/s
    meter.observe(100, busy=False, now=10.0)  # idle: says nothing about capacity
    assert meter.tokens_per_s == 100
    meter.observe(300, busy=True, now=11.0)  # 200 tok/s
    assert meter.tokens_per_s == 150
    meter.observe(300, busy=True, now=12.0, steps_total=0)
    meter.observe(400, busy=True, now=13.0, steps_total=20)  # 20 steps/s: one sequence's rate
    assert meter.sequence_tokens_per_s == 20
    meter.record_job(10)
    meter.record_job(20)
    assert 10 < meter.mean_job_tokens < 20


def test_a_cold_model_that_was_loaded_before_is_estimated_from_its_load_time():
    live = [{"name": "w1", "model": "a", "max_batch_size": 4, "tokens_per_s": 80.0, "mean_job_tokens": 40.0}]
    last = {"a": {"load_s": 9.0, "slots": 4}, "b": {"load_s": 12.0, "slots": 2, "tokens_per_s": 40.0}}
    loads = fleet_loads(live, last)
    assert loads["a"][0].ready_in_s == 0.0  # held by a live worker: its last load does not count
    assert estimate(ahead=0, max_tokens=40, workers=loads["b"]).start_in_s == 12.0
    # two slots once loaded, 20 tok/s each: the third job in line starts when a first one ends
    assert estimate(ahead=2, max_tokens=40, workers=loads["b"]).start_in_s == 12.0 + 128 / 20.0
    assert "c" not in fleet_loads(live, last)  # never loaded: no guess
