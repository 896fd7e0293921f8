"""Inputs: ServerArgs, ModelFacts, Platform, ForwardMode/LayerKind and the fact namespace."""
