"""cosearch: train search agents with RL while the document ranker learns with them."""

__version__ = "0.1.0"
