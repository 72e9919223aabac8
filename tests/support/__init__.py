"""Test support code shared by the test folders: processes, the demo, the sim, injected
sleeps, Redis, the real stacks and the tiny model."""
