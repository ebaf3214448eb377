"""Fuzzing: random inputs with a model of what each should do, run where a
crash is caught and pinned to its input; kvref's own campaign (`make fuzz`)
and call sequences against any implementation under test (`kvprobe fuzz`)."""
