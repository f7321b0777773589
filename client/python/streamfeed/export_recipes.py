"""The service options an export writes beside the model
(streamfeed.export.export_model): torchvision's classification recipe as
augment options, and torch.optim's optimizers at their defaults as optim
options."""
from typing import Any, Dict, Tuple

from .export_error import ExportError


def imagenet_recipe(input_hw: Tuple[int, int]) -> Dict[str, Any]:
    """torchvision's classification recipe for an input of input_hw, as
    augment options: training takes a random resized crop of that size and
    a horizontal flip; eval resizes to 256/224 of it and takes the centre
    crop; both scale to [0,1] and normalize with the ImageNet statistics."""
    h, w = input_hw
    rh, rw = round(h * 256 / 224), round(w * 256 / 224)
    to = {"op": "to_dtype", "dtype": "float32", "scale": 1 / 255}
    norm = {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    return {"augment": {
        "pipeline": [to, {"op": "random_resized_crop", "size": [h, w]}, {"op": "horizontal_flip", "p": 0.5}, norm],
        "eval_pipeline": [to, {"op": "resize", "size": [rh, rw]}, {"op": "center_crop", "size": [h, w]}, norm]}}


# torch.optim's defaults, as the service's optim options (docs/CONFIG.md):
# the service's own optim.weight_decay default is 0, torch.optim.AdamW's 0.01.
_OPTIMIZERS: Dict[str, Dict[str, Any]] = {
    "sgd": {"name": "sgd", "lr": 1e-3, "momentum": 0.0, "weight_decay": 0.0},
    "adamw": {"name": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
}


def optimizer_recipe(name: str) -> Dict[str, Any]:
    """The optim options of torch.optim's optimizer of that name at its
    defaults: ``"adamw"`` is ``torch.optim.AdamW(params)`` (lr 1e-3, betas
    (0.9, 0.999), eps 1e-8, weight_decay 0.01; Vision Transformers train
    with it), ``"sgd"`` is ``torch.optim.SGD(params)`` (lr 1e-3, no momentum
    or weight decay). ``config={"optim": {...}}`` changes any of them."""
    if name not in _OPTIMIZERS:
        raise ExportError(f"optimizer {name!r}: known are {', '.join(repr(k) for k in _OPTIMIZERS)} and None")
    return {"optim": dict(_OPTIMIZERS[name])}


def _merge(into: Dict[str, Any], extra: Dict[str, Any]) -> None:
    for sec, opts in extra.items():
        if not isinstance(opts, dict):
            raise ExportError(f"config section {sec!r} must be an object of options")
        into.setdefault(sec, {}).update(opts)
