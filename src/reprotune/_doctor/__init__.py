"""``reprotune doctor``: static checks, the empirical probe, and the report."""
