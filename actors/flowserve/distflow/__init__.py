"""DistFlow (DeepServe §4.4, xDeepServe §5.1, P/D-Serve §3.6): KV transfer between DP groups.

`channel.DistFlowChannel` is one isolated instance per prefill–decode DP-group pair (spawned by
the decode master on first use, `{decode master}/df/{k}`); `messages` holds its protocol."""
