"""The cluster manager (DeepServe §3), the heartbeat monitor (xDeepServe §6.1), the TE bootstrap
and the in-process pod launcher. Messages: `messages.py`; the pod port: `actors/ports/pod.py`."""
