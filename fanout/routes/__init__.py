"""Routes: a sink's ``where``/``select`` (``route``), evaluating it and naming what fails
(``evaluate``), isolating the rows that fail it (``rejects``), and every pending sink's input
for one batch (``batch_routes``).

Layer 3: imports the contract, the dead letters, observe and errors.
"""
