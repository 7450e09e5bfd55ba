"""Where does a vision model's inductive bias live? Exact checks, controlled experiments, counted compute."""
