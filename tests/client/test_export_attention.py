"""Self-attention written out in a user's forward() (export_attention.py):
one qkv Linear, the heads split by a view and a permute, attention through
F.scaled_dot_product_attention or the product, scale, softmax and product
written out, the heads merged, a proj Linear. Each spelling users write
exports as one self_attention layer named by the module holding both
projections, keeping their parameter names (param_names), and the spec
computes the module; a step that leaves the pattern is refused naming it.
A token sequence transposed (MLP-Mixer's token mixing: transpose_tokens).
The mean over the tokens a ViT's head may read instead of the class token
(token_mean, ``x[:, 1:].mean(dim=1)`` as timm's average pooling). Training
against PyTorch is tests/integration/test_export_parity.py's hand-written
ViT."""
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from streamfeed.export import ExportError, convert  # noqa: E402
from spec_interpreter import assert_spec_computes_the_module  # noqa: E402

HEADS, DIM = 2, 8


class Attn(nn.Module):
    """timm's Attention with its spelling picked by `how`."""

    def __init__(self, how="sdpa", qkv_bias=True):
        super().__init__()
        self.how = how
        self.num_heads, self.head_dim = HEADS, DIM // HEADS
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=qkv_bias)
        self.q_norm, self.k_norm, self.norm = nn.Identity(), nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        B, N, C = x.shape
        how = self.how
        qkv = self.qkv(x)
        qkv = (qkv.view if how == "view" else qkv.reshape)(B, N, 3, self.num_heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        if how in ("index", "div", "matmul"):
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:
            q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if how in ("sdpa", "view"):
            o = F.scaled_dot_product_attention(q, k, v)
        elif how == "sdpa_scale":
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=self.scale)
        elif how == "sdpa_mask":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif how == "sdpa_wrong_scale":
            o = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        elif how == "q_twice":
            o = F.scaled_dot_product_attention(q, k, v) + q
        elif how == "div":
            o = F.softmax(q @ k.transpose(2, 3) / math.sqrt(self.head_dim), dim=-1) @ v
        elif how == "matmul":
            o = torch.matmul(self.attn_drop(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, -1)), v)
        elif how == "k_scaled":
            o = (q @ (k * self.scale).transpose(-2, -1)).softmax(dim=-1) @ v
        else:  # q scaled first, as timm without fused attention
            a = (q * self.scale) @ k.transpose(-2, -1)
            o = self.attn_drop(a.softmax(dim=-1)) @ v
        if how == "permute":
            o = o.permute(0, 2, 1, 3).contiguous().flatten(2)
        else:
            o = o.transpose(1, 2).reshape(B, N, C)
        return self.proj(self.norm(o))


class Net(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.embed = nn.Conv2d(3, DIM, 4, 4)
        self.blocks = nn.Sequential(attn)
        self.head = nn.Linear(DIM, 5)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x)[:, 0])


NAMES = {"in_proj_weight": "qkv.weight", "in_proj_bias": "qkv.bias", "out_proj.weight": "proj.weight",
         "out_proj.bias": "proj.bias"}


@pytest.mark.parametrize("how", ["sdpa", "view", "sdpa_scale", "index", "div", "matmul", "q_first", "permute"])
def test_written_out_attention_is_one_self_attention_layer_keeping_the_module_names(how):
    torch.manual_seed(2)
    ex = assert_spec_computes_the_module(Net(Attn(how)), hw=8)
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", "to_tokens", "self_attention",
                                                               "select_token", "linear"]
    att = ex.spec["layers"][2]
    assert att == {"type": "self_attention", "name": "blocks.0", "num_heads": HEADS, "param_names": NAMES}
    assert {"blocks.0.qkv.weight", "blocks.0.qkv.bias", "blocks.0.proj.weight", "blocks.0.proj.bias"} <= \
        set(ex.tensors)


@pytest.mark.parametrize("how, why", [
    ("sdpa_mask", "mask"),
    ("sdpa_wrong_scale", "scale 1.0 is not 1/sqrt(head_dim)"),
    ("q_twice", "q is read by 2 ops"),
    ("k_scaled", "not by a transpose of its last two dimensions"),
])
def test_attention_leaving_the_pattern_is_refused_naming_the_step(how, why):
    with pytest.raises(ExportError) as e:
        convert(Net(Attn(how)), (1, 3, 8, 8))
    assert e.value.module_path == "blocks.0" and why in str(e.value), str(e.value)


def test_a_qkv_projection_without_bias_makes_a_layer_without_in_proj_bias():
    """timm's qkv_bias=False: the layer says so, computes the module and its checkpoint has no qkv.bias."""
    torch.manual_seed(4)
    ex = assert_spec_computes_the_module(Net(Attn(qkv_bias=False)), hw=8)
    att = ex.spec["layers"][2]
    names = {k: v for k, v in NAMES.items() if k != "in_proj_bias"}
    assert att == {"type": "self_attention", "name": "blocks.0", "num_heads": HEADS, "in_proj_bias": False,
                   "param_names": names}
    assert {"blocks.0.qkv.weight", "blocks.0.proj.weight", "blocks.0.proj.bias"} <= set(ex.tensors)
    assert "blocks.0.qkv.bias" not in ex.tensors


def test_attention_dropout_in_training_is_refused():
    class Dropping(Attn):
        def forward(self, x):
            B, N, C = x.shape
            q, k, v = self.qkv(x).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
            return self.proj(o.transpose(1, 2).reshape(B, N, C))
    with pytest.raises(ExportError, match="dropout_p 0.1"):
        convert(Net(Dropping()).train(), (1, 3, 8, 8))


def test_projections_of_two_modules_are_refused():
    class Apart(nn.Module):
        """qkv at the top level, proj inside another module: no module holds both."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, DIM, 4, 4)
            self.qkv = nn.Linear(DIM, 3 * DIM)
            self.out = nn.Sequential(nn.Linear(DIM, DIM))
            self.head = nn.Linear(DIM, 5)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            B, N, C = x.shape
            q, k, v = self.qkv(x).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C)
            return self.head(self.out(o)[:, 0])
    with pytest.raises(ExportError, match="not held by one module"):
        convert(Apart(), (1, 3, 8, 8))


def test_a_linear_to_three_widths_that_is_not_split_into_heads_stays_a_linear_layer():
    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, DIM, 4, 4)
            self.fc = nn.Linear(DIM, 3 * DIM)
            self.head = nn.Linear(3 * DIM, 5)

        def forward(self, x):
            return self.head(F.relu(self.fc(self.embed(x).flatten(2).transpose(1, 2)))[:, 0])
    ex = convert(Wide(), (1, 3, 8, 8))
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", "to_tokens", "linear", "relu",
                                                               "select_token", "linear"]


class Pooled(nn.Module):
    """Tokens, then the mean over them as `pool` spells it."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool
        self.embed = nn.Conv2d(3, DIM, 4, 4)
        self.head = nn.Linear(DIM, 5)
        if pool == "channels":  # over the 4 tokens of an 8x8 input
            self.head_t = nn.Linear(4, 5)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        p = self.pool
        if p == "all":
            y = x.mean(dim=1)
        elif p == "rest":
            y = x[:, 1:].mean(dim=1)
        elif p == "torch":
            y = torch.mean(x[:, 2:], -2)
        elif p == "keepdim":
            y = x.mean(1, keepdim=True)[:, 0]
        elif p == "channels":
            return self.head_t(x.mean(-1))
        elif p == "slice_read":
            y = x[:, 1:].mean(dim=1) + torch.relu(x[:, 1:]).mean(dim=1)
        else:
            y = x[:, 1:3].mean(dim=1)
        return self.head(y)


@pytest.mark.parametrize("pool, start", [("all", None), ("rest", 1), ("torch", 2)])
def test_a_mean_over_the_tokens_is_token_mean(pool, start):
    torch.manual_seed(3)
    ex = assert_spec_computes_the_module(Pooled(pool), hw=8)
    layer = {"type": "token_mean", "name": "mean"}
    if start:
        layer["start"] = start
    assert ex.spec["layers"][2] == layer


@pytest.mark.parametrize("pool, why", [
    ("keepdim", "no keepdim"),
    ("channels", "not dim=-1"),
    ("slice_read", "as the input of a mean over the tokens"),
    ("bounded", "indexes a token sequence with"),
])
def test_other_means_and_slices_of_tokens_are_refused(pool, why):
    with pytest.raises(ExportError) as e:
        convert(Pooled(pool), (1, 3, 8, 8))
    assert why in str(e.value), str(e.value)



class TokenMixing(nn.Module):
    """MLP-Mixer's token mixing: a Linear over the tokens of the transposed
    sequence, spelled transpose(1, 2) or permute(0, 2, 1)."""

    def __init__(self, spelling):
        super().__init__()
        self.spelling = spelling
        self.embed = nn.Conv2d(3, DIM, 4, 4)
        self.mix = nn.Linear(4, 6)
        self.head = nn.Linear(DIM, 5)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)  # 4 tokens of DIM
        if self.spelling == "permute":
            y = self.mix(x.permute(0, 2, 1)).permute(0, 2, 1)
        else:
            y = self.mix(x.transpose(1, 2)).transpose(-1, -2)
        return self.head(y.mean(1))


@pytest.mark.parametrize("spelling", ["transpose", "permute"])
def test_a_token_sequence_transposed_is_transpose_tokens(spelling):
    torch.manual_seed(5)
    ex = assert_spec_computes_the_module(TokenMixing(spelling), hw=8)
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", "to_tokens", "transpose_tokens", "linear",
                                                               "transpose_tokens", "token_mean", "linear"]


def _hf_vit(**kw):
    """tests/integration/hf_style_vit.py's ViT in Hugging Face's layout (no transformers needed)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
    from hf_style_vit import ViTForImageClassification
    return ViTForImageClassification(**{"img": 16, "patch": 8, "dim": DIM, "depth": 2, "heads": HEADS,
                                        "classes": 4, **kw})


HF_NAMES = {"q_proj.weight": "attention.query.weight", "k_proj.weight": "attention.key.weight",
            "v_proj.weight": "attention.value.weight", "q_proj.bias": "attention.query.bias",
            "k_proj.bias": "attention.key.bias", "v_proj.bias": "attention.value.bias",
            "out_proj.weight": "output.dense.weight", "out_proj.bias": "output.dense.bias"}


@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "eager"])
def test_hugging_face_query_key_value_linears_are_one_self_attention_layer_keeping_their_names(sdpa):
    """ViTSelfAttention's three Linears of the same tokens, split into heads
    (the key first, one by view + transpose, the others by
    transpose_for_scores' view + permute), attended (SDPA or written out)
    and merged, then the sibling output.dense: one self_attention with
    separate_qkv named by the module holding all four, every checkpoint key
    the module's own; x[:, 0, :] is the class token."""
    torch.manual_seed(6)
    model = _hf_vit(sdpa=sdpa)
    ex = assert_spec_computes_the_module(model, hw=16)
    atts = [layer for layer in ex.spec["layers"] if layer["type"] == "self_attention"]
    assert [a["name"] for a in atts] == ["vit.encoder.layer.0.attention", "vit.encoder.layer.1.attention"]
    assert atts[0] == {"type": "self_attention", "name": "vit.encoder.layer.0.attention", "num_heads": HEADS,
                       "separate_qkv": True, "param_names": HF_NAMES}
    assert "linear" not in [layer["type"] for layer in ex.spec["layers"][:4]]  # no Linear of q, k or v alone
    assert ex.spec["layers"][-2]["type"] == "select_token"
    assert set(ex.tensors) == set(model.state_dict())


def test_hugging_face_attention_without_qkv_bias_makes_a_layer_without_in_proj_bias():
    torch.manual_seed(7)
    model = _hf_vit(qkv_bias=False)
    ex = assert_spec_computes_the_module(model, hw=16)
    att = next(layer for layer in ex.spec["layers"] if layer["type"] == "self_attention")
    assert att == {"type": "self_attention", "name": "vit.encoder.layer.0.attention", "num_heads": HEADS,
                   "separate_qkv": True, "in_proj_bias": False,
                   "param_names": {k: v for k, v in HF_NAMES.items() if k[1:] != "_proj.bias"}}
    assert set(ex.tensors) == set(model.state_dict())


def test_separate_projections_that_are_not_three_or_differ_in_bias_are_refused():
    """Two Linears split into heads (q and k, v taken from elsewhere) and q,
    k, v of which one has no bias: refused naming the step."""
    class TwoProjections(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.out = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

        def forward(self, x):
            q = self.query(x).view(x.shape[0], -1, HEADS, DIM // HEADS).transpose(1, 2)
            k = self.key(x).view(x.shape[0], -1, HEADS, DIM // HEADS).transpose(1, 2)
            v = x.view(x.shape[0], -1, HEADS, DIM // HEADS).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v)
            return self.out(o.transpose(1, 2).reshape(x.shape))

    with pytest.raises(ExportError) as e:
        convert(Net(TwoProjections()), (1, 3, 8, 8))
    assert "2 Linear(8, 8) of the same tokens are split into heads" in str(e.value), str(e.value)
    model = _hf_vit()
    model.vit.encoder.layer[1].attention.attention.value = nn.Linear(DIM, DIM, bias=False)
    with pytest.raises(ExportError) as e:
        convert(model, (1, 3, 16, 16))
    assert e.value.module_path == "vit.encoder.layer.1.attention.attention" and "have a bias and some do not" in \
        str(e.value), str(e.value)


class MixedPrecisionAttn(Attn):
    """The attention written out as transformers' eager_attention_forward
    writes it for mixed precision: the softmax in float32, cast back to q's
    dtype, then a dropout (p 0: ViTConfig's attention_probs_dropout_prob) of the
    module's training flag."""

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scale
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        w = F.dropout(w, p=0.0, training=self.training)
        return self.proj(torch.matmul(w, v).transpose(1, 2).contiguous().reshape(B, N, C))


def test_a_softmax_in_float32_cast_back_to_qs_dtype_is_the_same_attention():
    torch.manual_seed(5)
    ex = assert_spec_computes_the_module(Net(MixedPrecisionAttn()), hw=8)
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", "to_tokens", "self_attention",
                                                               "select_token", "linear"]
