"""FlowServe inside a Task Executor (issue 10): TE shell, DP-group masters, RTC, DistFlow.

How to wire a TE (kept current for the scenario runner; see docs/flowserve.md):
    messages.py   the TE's interface (SubmitTask / TaskAccepted / TaskTokens / TaskFinished ...)
    tokens.py     prompt block hashes (from token ids or Mooncake hash_ids), fingerprints,
                  the emulated token stream and EOS
(the wiring recipe is filled in as the master and the shell land)
"""
