"""The gateway (issue 6 §1, §4): admission control and request → job on a JE chosen at random."""
