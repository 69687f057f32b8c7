"""ETA arithmetic from worker measurements."""
from common.eta import WorkerLoad, estimate, retry_after

BUSY = WorkerLoad(capacity=4, running=4, tokens_per_s=80.0, mean_job_tokens=40.0)  # drains 2 jobs/s
IDLE = WorkerLoad(capacity=4, running=1, tokens_per_s=80.0, mean_job_tokens=40.0)


def test_free_slot_means_start_now():
    eta = estimate(ahead=2, max_tokens=40, workers=[IDLE])
    assert eta.start_in_s < 0.1
    assert eta.finish_in_s == eta.start_in_s + 40 / 20.0  # 80 tok/s shared by 4 slots


def test_queue_wait_grows_with_position_and_shrinks_with_workers():
    one = [estimate(ahead=n, max_tokens=40, workers=[BUSY]).start_in_s for n in range(4)]
    assert one == [0.5, 1.0, 1.5, 2.0]
    two = estimate(ahead=3, max_tokens=40, workers=[BUSY, BUSY]).start_in_s
    assert two == 1.0


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
    meter.record_job(10)
    meter.record_job(20)
    assert 10 < meter.mean_job_tokens < 20
