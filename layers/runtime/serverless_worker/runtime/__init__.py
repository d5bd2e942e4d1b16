"""The serverless runtime: scheduler ticks, executors, state-machine steps, reaper and drain."""
