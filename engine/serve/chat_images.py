"""Images in chat messages (OpenAI's ``image_url`` parts) for a vision-language model.

Each image is decoded from its data: URL (base64; this server fetches nothing from the network) and marked where the
chat template puts it, by the model's image token (LLaVA's ``<image>``), in either of the two ways templates read
content, as vLLM tells them apart:
- a template that walks a message's content parts (Hugging Face's LLaVA templates test each part's ``type``) gets
  the parts, an image as ``{"type": "image"}``, and writes the mark itself;
- a template that reads content as a string gets the text with one mark per image in front of it, each on its own
  line (vLLM's placement).
The images go with the rendered prompt as ``multi_modal_data``, in the order of their parts across the messages,
which is the order of the marks in the prompt (engine/multimodal_inputs.py expands each mark).
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from engine.serve.errors import OpenAIError
from engine.serve.protocol import ChatImagePart, ChatTextPart


def decode_image_url(url: str, where: str):
    """The RGB PIL image of a base64 data: URL, or a 400 naming ``where``."""
    header, comma, payload = url.partition(",")
    if not url.startswith("data:"):
        raise OpenAIError(f"{where}.image_url.url: only data: URLs (base64 images) are accepted; this server fetches "
                          f"nothing from the network, got {url[:40]!r}", param="messages")
    if not comma or not header.endswith(";base64"):
        raise OpenAIError(f"{where}.image_url.url: a data: URL must be base64 (data:image/png;base64,...), got "
                          f"{header[:40]!r}", param="messages")
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(base64.b64decode(payload, validate=True)))
        image.load()
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as error:
        raise OpenAIError(f"{where}.image_url.url: not a readable image ({error})", param="messages") from None
    return image.convert("RGB")


def reads_content_parts(template: str | None) -> bool:
    """Whether a chat template walks content parts by type (else it reads content as a string)."""
    return isinstance(template, str) and "type" in template and "image" in template


def mark_images(body: Any, messages: list[dict[str, Any]], image_token: str | None, template: str | None) -> list:
    """Put each image part of ``body``'s messages into the template's ``messages`` (built from them, one for one) as
    the template reads it; return the decoded images in prompt order. ``image_token``: the model's image mark (None:
    a text-only model, which refuses images by name). For a template that walks content parts, every message's text
    goes as a text part, images or not, as vLLM sends it."""
    if image_token is None:
        for index, message in enumerate(body.messages):
            if message.image_urls():
                raise OpenAIError(f"messages[{index}]: image_url content needs a vision-language model whose images "
                                  "this server encodes (LLaVA); this model takes text only", param="messages")
        return []
    images = []
    parts_format = reads_content_parts(template)
    for index, (message, entry) in enumerate(zip(body.messages, messages)):
        if isinstance(message.content, str):
            if parts_format and isinstance(entry["content"], str):
                entry["content"] = [{"type": "text", "text": entry["content"]}]
            continue
        if not isinstance(message.content, list):
            continue  # an assistant's tool calls without content
        parts = []
        for part_index, part in enumerate(message.content):
            if isinstance(part, ChatImagePart):
                images.append(decode_image_url(part.image_url.url, f"messages[{index}].content[{part_index}]"))
                parts.append({"type": "image"})
            elif isinstance(part, ChatTextPart):
                parts.append({"type": "text", "text": part.text})
        if parts_format:
            entry["content"] = parts
        else:
            marks = sum(part["type"] == "image" for part in parts)
            entry["content"] = f"{image_token}\n" * marks + message.text()
    return images
