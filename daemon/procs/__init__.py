"""`deepserve up --processes`: the control plane, JE, gateway and HTTP frontend in the main
process, one OS process per TE, all over ZeroMQ (issue 7 §3). See docs/decisions.md."""
