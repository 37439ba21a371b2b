"""Training drafters on this machine (``specdec train-drafter``): teacher-forced target features
(:mod:`.data`), the EAGLE head's training loop (:mod:`.eagle`), the report (:mod:`.report`) and the
whole job (:mod:`.pipeline`). Importing this package imports nothing."""
