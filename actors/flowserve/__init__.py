"""FlowServe inside a Task Executor (issue 10): TE shell, DP-group masters, RTC, DistFlow.

Modules: `messages` (the TE's interface), `tokens` (prompt block hashes, fingerprints, emulated
token stream), `te_shell` (+ the pure `balancer`), `master/` (one DP group: scheduler, output path,
prefetch cost model, PD hooks, context caching), `rtc/` (the Relational Tensor Cache, embedded in
each master's state), `distflow/` (one channel actor per prefill–decode DP-group pair).
docs/flowserve.md describes them; here is how to wire a TE.

How to wire a TE (in a SimDriver or an AsyncDriver)::

    import msgspec
    from deepserve.actors.flowserve.master.state import MasterConfig
    from deepserve.actors.flowserve.te_shell import TeConfig, TeShell
    from deepserve.adapters.hardware.devices.topology import gen1_cluster, spawn_topology

    spawn_topology(driver, gen1_cluster(1))                   # NPUs, hosts, fabric: hw/...
    dp0 = MasterConfig(
        model="llama3-8b", npus=("hw/s0/npu0",),             # the group's TP ranks
        kv_block_bytes=..., hbm_blocks=...,                   # size them with adapters/hardware/
        block_tokens=128,                                     #   memory.py (see scenario/builder)
        dram_blocks=0, host="hw/s0/host",                     # DRAM tier (0: none)
        role="colocated",                                     # or "prefill" / "decode"
        aggregate=True,                                       # sim fast path; False: step each pass
        token_ids=False,                                      # sims that only measure: times only
        te="te/0", dp=0)
    te = TeConfig(te="te/0", role="colocated", dps=(dp0,), cluster_manager=None)
    driver.spawn("te/0", TeShell, config=msgspec.to_builtins(te))   # spawns te/0/dp/0 ...

    # a task (a JE, the workload actor, a test): answers go to `reply_to`
    driver.inject("te/0", SubmitTask(task_id="t1", request_id="r1", kind="chat", model="llama3-8b",
                  prompt=Prompt(num_tokens=n, block_hashes=tokens.chain_hashes_from_trace_blocks(
                      hash_ids, n, 128)),
                  sampling=Sampling(max_tokens=512, target_output_tokens=None, seed=7),
                  reply_to="ext/client"), at=0.0)
    # reply_to receives TaskAccepted, TaskTokens (one per pass, or one per run when aggregated),
    # and exactly one TaskFinished.

PD-disaggregated: one TE with role="prefill", one with role="decode" (each MasterConfig.role
too). Send SubmitTask(kind="prefill") to P; its TaskFinished carries `kv` (a KvHandle); then
send the same task as kind="decode" with `kv_source=that handle` to D. D pulls the KV through a
DistFlow channel it spawns (`{D master}/df/{k}`), verifies fingerprints and decodes tokens 1...
Fault input for KV integrity: `CorruptKvBlock(task_id, block_index)` to the decode DP master.
"""
