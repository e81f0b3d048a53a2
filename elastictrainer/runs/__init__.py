"""One command-line run's lifecycle: set up (setup.py: data, model, steps, time model), the
loop (loop.py), and what is recorded around it (recorder.py: summary.json, TensorBoard and the
closing line, for model.fit's runs too; checkpoint.py; energy.py; interrupt.py: Ctrl-C and the
kill-at-a-step testing hook)."""
