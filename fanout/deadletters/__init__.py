"""Dead letters: the rows a sink's route or target refuses, kept instead of failing the batch."""
