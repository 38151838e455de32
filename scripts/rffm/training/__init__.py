"""Every loop and every evaluation: head epochs and sweeps, pretraining, the reference CNN, selection, qualification."""
