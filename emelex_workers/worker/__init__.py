"""The worker behind `emelex memory work`: the run loop (`work`), planning for the model it runs (`planning`),
the metered binding that records an attempt's cost (`metering`), the wording of a job's attempts (`attempts`) and
the run report (`work_report`).

Imports emelex_memory, the host, `models` and `faithfulness`; never the agent, the CLI or the demo.
"""
