"""Training drafters on this machine (``specdec train-drafter``): teacher-forced target features
(:mod:`.data`), the heads' training loop and losses (:mod:`.loop`, :mod:`.losses`), DistillSpec (:mod:`.distill`), the report (:mod:`.report`) and the
whole job (:mod:`.pipeline`). Importing this package imports nothing."""
