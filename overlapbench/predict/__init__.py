"""`overlapbench predict`: a TP=k study's answer from one GPU's compute pieces and a table of collectives."""
