"""Routes: a sink's ``where``/``select`` applied to each batch, and the rows that fail them."""
