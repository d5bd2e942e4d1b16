import time

import pytest


@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack", "claimqueue"])
def test_smoke(worker_env, protocol):
    env = worker_env(protocol, handlers=["echo"])
    env.seed("echo", [{"n": i} for i in range(5)])
    report = env.tick(2.0)
    print(report)
    env.stack.wait_idle(20)
    time.sleep(0.5)
    jobs = env.admin.jobs()
    print(jobs[0])
