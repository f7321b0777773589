"""A Vision Transformer in Hugging Face's layout (transformers' ViTModel and
ViTForImageClassification, written out here so that the tests need no
transformers): embeddings.patch_embeddings.projection (a patch convolution),
embeddings.cls_token and embeddings.position_embeddings; per layer
layernorm_before, attention.attention.{query, key, value} (three Linears of
the same tokens, each viewed into the heads and transposed, key first as
transformers computes them), attention.output.dense, layernorm_after,
intermediate.dense with GELU and output.dense, each half a residual; a final
layernorm and the classifier on ``x[:, 0, :]``. ``sdpa`` picks the attention's
spelling: F.scaled_dot_product_attention (transformers' "sdpa") or the
product, division by sqrt(head_size), softmax, dropout and product written
out ("eager"); ``qkv_bias=False`` leaves the three Linears without a bias
(ViTConfig's qkv_bias)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, sdpa=True, qkv_bias=True):
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = dim // heads
        self.all_head_size = dim
        self.sdpa = sdpa
        self.query = nn.Linear(dim, dim, bias=qkv_bias)
        self.key = nn.Linear(dim, dim, bias=qkv_bias)
        self.value = nn.Linear(dim, dim, bias=qkv_bias)
        self.dropout = nn.Dropout(0.0)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_x_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states):
        batch_size = hidden_states.shape[0]
        key_layer = self.key(hidden_states).view(batch_size, -1, self.num_attention_heads,
                                                 self.attention_head_size).transpose(1, 2)
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        if self.sdpa:
            context_layer = F.scaled_dot_product_attention(query_layer, key_layer, value_layer, None,
                                                           dropout_p=0.0, is_causal=False, scale=None)
        else:
            attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
            attention_scores = attention_scores / math.sqrt(self.attention_head_size)
            attention_probs = nn.functional.softmax(attention_scores, dim=-1)
            attention_probs = self.dropout(attention_probs)
            context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(new_context_layer_shape)


class SelfOutput(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.0)

    def forward(self, hidden_states):
        return self.dropout(self.dense(hidden_states))


class Attention(nn.Module):
    def __init__(self, dim, heads, sdpa, qkv_bias):
        super().__init__()
        self.attention = SelfAttention(dim, heads, sdpa, qkv_bias)
        self.output = SelfOutput(dim)

    def forward(self, hidden_states):
        return self.output(self.attention(hidden_states))


class Intermediate(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.dense = nn.Linear(dim, hidden)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class Output(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(0.0)

    def forward(self, hidden_states, input_tensor):
        return self.dropout(self.dense(hidden_states)) + input_tensor


class Layer(nn.Module):
    def __init__(self, dim, heads, sdpa, qkv_bias):
        super().__init__()
        self.attention = Attention(dim, heads, sdpa, qkv_bias)
        self.intermediate = Intermediate(dim, 2 * dim)
        self.output = Output(dim, 2 * dim)
        self.layernorm_before = nn.LayerNorm(dim, eps=1e-12)
        self.layernorm_after = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, hidden_states):
        hidden_states = self.attention(self.layernorm_before(hidden_states)) + hidden_states
        return self.output(self.intermediate(self.layernorm_after(hidden_states)), hidden_states)


class PatchEmbeddings(nn.Module):
    def __init__(self, dim, patch):
        super().__init__()
        self.projection = nn.Conv2d(3, dim, patch, patch)

    def forward(self, pixel_values):
        return self.projection(pixel_values).flatten(2).transpose(1, 2)


class Embeddings(nn.Module):
    def __init__(self, img, patch, dim):
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.patch_embeddings = PatchEmbeddings(dim, patch)
        self.position_embeddings = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim) * 0.02)
        self.dropout = nn.Dropout(0.0)

    def forward(self, pixel_values):
        embeddings = self.patch_embeddings(pixel_values)
        cls_tokens = self.cls_token.expand(embeddings.shape[0], -1, -1)
        embeddings = torch.cat((cls_tokens, embeddings), dim=1)
        return self.dropout(embeddings + self.position_embeddings)


class Encoder(nn.Module):
    def __init__(self, dim, depth, heads, sdpa, qkv_bias):
        super().__init__()
        self.layer = nn.ModuleList([Layer(dim, heads, sdpa, qkv_bias) for _ in range(depth)])

    def forward(self, hidden_states):
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states)
        return hidden_states


class ViTModel(nn.Module):
    def __init__(self, img, patch, dim, depth, heads, sdpa, qkv_bias):
        super().__init__()
        self.embeddings = Embeddings(img, patch, dim)
        self.encoder = Encoder(dim, depth, heads, sdpa, qkv_bias)
        self.layernorm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, pixel_values):
        return self.layernorm(self.encoder(self.embeddings(pixel_values)))


class ViTForImageClassification(nn.Module):
    def __init__(self, img=32, patch=8, dim=32, depth=2, heads=4, classes=10, sdpa=True, qkv_bias=True):
        super().__init__()
        self.vit = ViTModel(img, patch, dim, depth, heads, sdpa, qkv_bias)
        self.classifier = nn.Linear(dim, classes)

    def forward(self, pixel_values):
        sequence_output = self.vit(pixel_values)
        return self.classifier(sequence_output[:, 0, :])
