"""Images in chat messages for a vision-language model, shared by ``LLM.chat`` and the server's chat route.

A message's content is a string or a list of parts: ``{"type": "text", "text": ...}``, OpenAI's ``{"type":
"image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (base64 data: URLs only: nothing is fetched from
the network) or, in Python, vLLM's ``{"type": "image_pil", "image_pil": image}``. Each image is marked where the chat
template puts it, by the model's image token (LLaVA's ``<image>``), in either of the two ways templates read content,
as vLLM tells them apart:
- a template that walks a message's content parts (Hugging Face's LLaVA templates test each part's ``type``) gets
  the parts, an image as ``{"type": "image"}``, and writes the mark itself (every message then goes as parts);
- a template that reads content as a string gets the text with one mark per image in front of it, each on its own
  line (vLLM's placement).
The images go with the rendered prompt as ``multi_modal_data``, in the order of their parts across the messages,
which is the order of the marks in the prompt (engine/multimodal_inputs.py expands each mark). Errors are
ValueErrors naming the message and part.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any


def decode_image_url(url: str, where: str):
    """The RGB PIL image of a base64 data: URL (``where``: the part, named in the ValueError of a bad one)."""
    header, comma, payload = url.partition(",")
    if not url.startswith("data:"):
        raise ValueError(f"{where}.image_url.url: only data: URLs (base64 images) are accepted; nothing is fetched "
                         f"from the network, got {url[:40]!r}")
    if not comma or not header.endswith(";base64"):
        raise ValueError(f"{where}.image_url.url: a data: URL must be base64 (data:image/png;base64,...), got "
                         f"{header[:40]!r}")
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(base64.b64decode(payload, validate=True)))
        image.load()
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{where}.image_url.url: not a readable image ({error})") from None
    return image.convert("RGB")


def reads_content_parts(template: str | None) -> bool:
    """Whether a chat template walks content parts by type (else it reads content as a string)."""
    return isinstance(template, str) and "type" in template and "image" in template


def content_parts(content: list, where: str) -> list[dict[str, Any]]:
    """``content``'s parts as ``{"type": "text", "text"}`` or ``{"type": "image", "image": decoded image}``."""
    parts = []
    for index, part in enumerate(content):
        label = f"{where}.content[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            if not isinstance(url, str):
                raise ValueError(f"{label}.image_url must be {{'url': 'data:...'}}, got {image_url!r:.60}")
            parts.append({"type": "image", "image": decode_image_url(url, label)})
        elif kind == "image_pil" and part.get("image_pil") is not None:
            parts.append({"type": "image", "image": part["image_pil"]})
        else:
            raise ValueError(f"{label} must be a text, image_url or image_pil part, got {part!r:.80}")
    return parts


def mark_images(messages: list[dict[str, Any]], image_token: str | None, template: str | None) -> list:
    """Rewrite each message whose ``content`` is a list of parts (``content_parts``' shape) as the template reads
    it, in place; return the images in prompt order. ``image_token``: the model's image mark (None: a model that
    takes no images, refused by name)."""
    parts_format = reads_content_parts(template)
    images = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            if parts_format and image_token is not None and isinstance(content, str):
                message["content"] = [{"type": "text", "text": content}]
            continue
        shown = [part["image"] for part in content if part["type"] == "image"]
        if shown and image_token is None:
            raise ValueError(f"messages[{index}]: image content needs a vision-language model whose images this "
                             "engine encodes (Gemma 3, InternVL, LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Mistral 3); this engine takes "
                             "text only")
        images += shown
        text = "".join(part["text"] for part in content if part["type"] == "text")
        if parts_format and image_token is not None:
            message["content"] = [{"type": "image"} if part["type"] == "image" else part for part in content]
        else:
            message["content"] = f"{image_token}\n" * len(shown) + text
    return images


def image_token(image_inputs, tokenizer) -> str | None:
    """The model's image mark as text (None: a model without images)."""
    if image_inputs is None or tokenizer is None:
        return None
    return tokenizer.convert_ids_to_tokens(image_inputs.mark_token_id)
