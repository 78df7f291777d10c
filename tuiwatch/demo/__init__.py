"""Built-in synthetic trainings that ``tuiwatch demo`` runs with a Watch attached (imports torch)."""
