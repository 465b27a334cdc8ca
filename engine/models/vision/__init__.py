"""Vision encoders of vision-language checkpoints: pixels in, one embedding per placeholder token out.

The language model is the text model the registry builds (engine/models/multimodal_text.py loads it); the encoder
here is loaded beside it from the same folder and run by the runner for the images the scheduler names
(engine/runner/encoder_outputs.py).
"""

from engine.models.vision.image_encoders import ImageEncoder, fixed_image_size, image_encoder_class, load_image_encoder

__all__ = ["ImageEncoder", "fixed_image_size", "image_encoder_class", "load_image_encoder"]
