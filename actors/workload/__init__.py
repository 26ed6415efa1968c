"""The workload actor: a stand-in for issue 6's Job Executor in simulations.

It receives requests as external inputs (injected at their trace times), dispatches tasks to TEs
(round-robin for colocated TEs; prefill then decode to a P/D pair), collects the TEs' terminal
`TaskFinished` messages and records each request's terminal state exactly once.
"""
