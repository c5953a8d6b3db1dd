// The op lists of the measuring knobs (DFLASH_CUDA_NOOP, DFLASH_CUDA_PDL_SKIP): exact names,
// and "name*" for every launch name an op takes.
#include <gtest/gtest.h>

#include "backend/op_list.h"

namespace dflash {
namespace {

TEST(OpList, ExactNamesMatchOnlyThemselves) {
  EXPECT_TRUE(op_in_list("attention_merge", "attention_merge"));
  EXPECT_TRUE(op_in_list("rms_norm,attention_merge,qk_norm_rope_store", "qk_norm_rope_store"));
  EXPECT_TRUE(op_in_list("matmul (skinny),rms_norm", "matmul (skinny)"));
  // The list the fortieth pass used: `attention` is not the split's decode or block launch.
  EXPECT_TRUE(op_in_list("attention,attention_merge,qk_norm_rope_store", "attention"));
  EXPECT_FALSE(op_in_list("attention,attention_merge,qk_norm_rope_store", "attention_decode"));
  EXPECT_FALSE(op_in_list("attention,attention_merge,qk_norm_rope_store", "attention_block"));
  EXPECT_FALSE(op_in_list("attention_merge", "attention"));
  EXPECT_FALSE(op_in_list("", "attention"));
  EXPECT_FALSE(op_in_list(",,", "attention"));
  EXPECT_FALSE(op_in_list("matmul", "matmul (skinny)"));
}

TEST(OpList, StarNamesEveryLaunchNameWithThePrefix) {
  for (const char* op : {"attention", "attention_decode", "attention_block", "attention_merge"})
    EXPECT_TRUE(op_in_list("qk_norm_rope_store,attention*", op)) << op;
  EXPECT_FALSE(op_in_list("attention*", "qk_norm_rope_store"));
  EXPECT_FALSE(op_in_list("attention_d*", "attention_block"));
  EXPECT_TRUE(op_in_list("*", "rms_norm"));  // everything
  EXPECT_TRUE(op_in_list("matmul*", "matmul (skinny)"));
}

}  // namespace
}  // namespace dflash
