"""A Vision Transformer as users write their own, in timm's layout: a
patch-embedding convolution, a class token and a position embedding held
as parameters, pre-norm blocks whose attention projects q, k and v with one
Linear (qkv), splits the heads with reshape and permute and projects back
with another (proj), and a head on the class token. ``fused`` picks the
attention's spelling: F.scaled_dot_product_attention after unbind(0) (what
timm runs), or the product, scale, softmax and product written out after
indexing the split (what it runs without fused attention, and what older
code writes); ``pool`` the head's input: the class token ("token") or the
mean of the other tokens ("avg", timm's global_pool="avg"); ``init_values``
gives each block timm's LayerScale (gamma [C]) after its attention and MLP
and timm's LayerNorm (F.layer_norm of its own weight and bias);
``qkv_bias=False`` leaves the qkv Linear without a bias (timm Attention's
own default). forward() takes a mask as timm's does, None by default."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim, num_heads, fused=True, qkv_bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x, attn_mask=None):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            q, k, v = qkv.unbind(0)
            q, k = self.q_norm(q), self.k_norm(k)
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            q, k, v = qkv[0], qkv[1], qkv[2]
            attn = (q @ k.transpose(-2, -1)) * self.scale
            attn = F.softmax(attn, dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))


class LayerNorm(nn.LayerNorm):
    """timm's LayerNorm: an nn.LayerNorm subclass whose forward calls
    F.layer_norm on its own weight and bias."""

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class LayerScale(nn.Module):
    """timm's LayerScale: each channel of each token times gamma [C]."""

    def __init__(self, dim, init_values):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Block(nn.Module):
    def __init__(self, dim, heads, fused, init_values=None, qkv_bias=True):
        super().__init__()
        norm = LayerNorm if init_values else nn.LayerNorm  # the DeiT-III-like variant takes timm's
        self.norm1 = norm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, fused, qkv_bias)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.norm2 = norm(dim, eps=1e-6)
        self.mlp = Mlp(dim, dim * 2)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()

    def forward(self, x, attn_mask=None):
        x = x + self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask))
        return x + self.ls2(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    def __init__(self, img=32, patch=8, dim=32, depth=2, heads=4, classes=10, fused=True, pool="token",
                 init_values=None, qkv_bias=True):
        super().__init__()
        self.pool = pool
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads, fused, init_values, qkv_bias) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x, attn_mask=None, is_causal=False):
        """attn_mask and is_causal as timm's VisionTransformer takes them: the
        exporter traces their defaults (no mask)."""
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x, attn_mask=attn_mask)
        x = self.norm(x)
        return self.head(x[:, 1:].mean(dim=1) if self.pool == "avg" else x[:, 0])
