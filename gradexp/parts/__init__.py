"""What a run is made of, each built from its config: the custom-gradient layer (layers), the
clipping methods (clipping), the models and where the layers go in them (models, insertion),
the datasets (data, external_data) and the optimizers (optimizers). Imports config and runs."""
