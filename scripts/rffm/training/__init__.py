"""Every loop and every evaluation: head epochs, an epoch's members and sweeps, pretraining, the reference CNN,
selection, qualification, the export's agreement check."""
