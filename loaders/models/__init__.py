"""Model loading: diffusers folders and single files to one LoadedModel, cached per source."""
